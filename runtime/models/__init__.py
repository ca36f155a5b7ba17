"""Whole models: a transformers ``PreTrainedModel`` whose quantized layers are quantrt's.

``from_pretrained(path)`` builds the model on the meta device from the checkpoint's config (for
GGUF, rebuilt from its metadata) and fills it one tensor at a time; :mod:`.hf_quantizer` runs
the same layer replacement inside transformers' own ``from_pretrained``.
"""

from __future__ import annotations

from .loader import LoadReport, ModelLoader, from_pretrained
from .parallel import TensorParallel

__all__ = ["LoadReport", "ModelLoader", "TensorParallel", "from_pretrained"]
