"""triton backend."""
