"""Triton kernels on the CPU: without a GPU they run under Triton's interpreter (small shapes)."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
