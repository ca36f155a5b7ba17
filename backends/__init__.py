"""Per-vendor kernel folders behind one interface (``quantrt.kernels``).

``triton/`` holds portable Triton kernels; ``cuda/``, ``rocm/``, ``cpu/`` and ``xpu/`` decide
which kernels run on their hardware, in what order and with what tuning. Each vendor folder
registers through the ``quantrt.backends`` entry-point group and never imports another
vendor's folder.
"""
