"""Native CPU kernels (C++ with AVX-512/AVX2 intrinsics), built on first use: see :mod:`.build`."""
