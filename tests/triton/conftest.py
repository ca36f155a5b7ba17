"""Triton kernels on the CPU: without a GPU they run under Triton's interpreter (small shapes)."""

import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The GGUF tests share helpers in gguf_testing.py beside this file (importlib mode puts no test
# directory on sys.path by itself).
sys.path.insert(0, str(Path(__file__).parent))
