"""Writing quantized checkpoints other tools read: one module per format, each the inverse of the
format's reader (canonical weights in, the format's stored tensors and config out), and
``checkpoint.write_quantized`` streaming a dense checkpoint through one of them."""

from .checkpoint import WRITERS, write_quantized

__all__ = ["WRITERS", "write_quantized"]
