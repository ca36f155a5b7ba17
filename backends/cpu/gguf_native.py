"""Native CPU kernels of this family (see backends/cpu/__init__.py); none registered yet."""

KERNELS: tuple = ()
