"""quantrt: quantized LLM weights in every common format, run by the fastest correct kernel here.

The public API is imported lazily, so ``quantrt probe`` stays fast::

    import quantrt
    caps = quantrt.probe()
    scheme = quantrt.parse_scheme("w4a16-int-g128-asym")
    w = quantrt.reference.quantize(dense, scheme)            # canonical tensors (RTN)
    layer = quantrt.QuantLinear.from_canonical(w, device="cpu")
    layer.kernel_name, layer(x)
    print(quantrt.explain(scheme, 4096, 4096).explain())     # the plan, every candidate's verdict
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "probe": "quantrt.capability",
    "Capabilities": "quantrt.capability",
    "DeviceCaps": "quantrt.capability",
    "load_capabilities": "quantrt.capability",
    "CapabilityError": "quantrt.capability",
    "Scheme": "quantrt.schemes",
    "KVCacheScheme": "quantrt.schemes",
    "parse_scheme": "quantrt.schemes",
    "parse_kv_scheme": "quantrt.schemes",
    "catalog": "quantrt.schemes",
    "SchemeError": "quantrt.schemes",
    "TensorSpec": "quantrt.specs",
    "LayerSpec": "quantrt.specs",
    "CanonicalWeight": "quantrt.canonical",
    "Kernel": "quantrt.kernels",
    "Verdict": "quantrt.kernels",
    "registry": "quantrt.kernels",
    "select": "quantrt.dispatch",
    "build": "quantrt.dispatch",
    "Selection": "quantrt.dispatch",
    "explain": "quantrt.plans",
    "plan_catalog": "quantrt.plans",
    "open_checkpoint": "quantrt.checkpoint",
    "Checkpoint": "quantrt.checkpoint",
    "QuantizedWeight": "quantrt.checkpoint",
    "CheckpointError": "quantrt.errors",
    "QuantLinear": "quantrt.layers",
    "QuantrtError": "quantrt.errors",
    "DispatchError": "quantrt.errors",
    "ShardError": "quantrt.errors",
    "ConfigError": "quantrt.errors",
    "from_pretrained": "quantrt.models",
    "TensorParallel": "quantrt.models",
    "QuantrtConfig": "quantrt.models.hf_quantizer",
}

__all__ = [*sorted(_LAZY), "reference"]


def __getattr__(name: str) -> Any:
    if name == "reference":
        return importlib.import_module("quantrt.reference")
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'quantrt' has no attribute {name!r}")
    return getattr(importlib.import_module(mod), name)
