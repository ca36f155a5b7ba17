"""rocm backend."""
