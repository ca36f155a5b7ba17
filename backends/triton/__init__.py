"""Portable Triton kernels shared by every GPU vendor.

The vendor folders (``cuda``, ``rocm``, ``xpu``) wrap these in Kernel classes and pass
their policy in (tile configs, fp8 flavour, TMA or wgmma switches); this folder never
registers kernels itself and never imports a vendor folder. Kernels arrive here with the
NVIDIA kernel issues.
"""
