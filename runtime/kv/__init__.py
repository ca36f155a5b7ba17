"""The quantized KV cache: schemes' storage, paged pools, the kernels that write and read them, and
the transformers ``Cache`` that puts them under a model.

- :class:`KVPages` (one layer's paged store) and :func:`kv_planes` / :func:`bytes_per_token` (what a
  scheme stores), in :mod:`.pages`;
- :func:`write_kv` (quantize on write) and :func:`decode_attention` (reads pages directly), in
  :mod:`.kernels`;
- :func:`attention_reference`, the fp32 oracle; :func:`kv_qmax` (the code magnitude a scale maps
  amax onto, for backends' write kernels);
- :class:`QuantKVCache` (a transformers ``Cache``) and :func:`kv_cache`, in :mod:`.cache`.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "KVPages": ".pages",
    "KVCacheError": ".pages",
    "Plane": ".pages",
    "kv_planes": ".pages",
    "bytes_per_token": ".pages",
    "write_kv": ".kernels",
    "decode_attention": ".kernels",
    "torch_decode_attention": ".kernels",
    "attention_reference": ".reference",
    "kv_qmax": "..reference.kv",
    "QuantKVCache": ".cache",
    "kv_cache": ".cache",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'quantrt.kv' has no attribute {name!r}")
    return getattr(importlib.import_module(mod, __name__), name)
