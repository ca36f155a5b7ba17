"""cpu backend."""
