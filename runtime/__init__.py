"""quantrt: quantized LLM weights in every common format, run by the fastest correct kernel here."""

from __future__ import annotations

__version__ = "0.1.0"
