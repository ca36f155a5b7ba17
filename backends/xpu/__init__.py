"""xpu backend."""
