"""quantrt as a transformers quantizer: ``from_pretrained(path, quantization_config=QuantrtConfig())``.

Importing this module registers ``QuantrtConfig`` and ``QuantrtHfQuantizer`` with transformers' own
registry (``register_quantization_config`` / ``register_quantizer``, method ``"quantrt"``). Then
transformers' loader builds the model on the meta device as usual, and before it reads any weight
the quantizer replaces every layer the checkpoint stores quantized, in any format quantrt reads,
with the ready QuantLinear :meth:`Checkpoint.linear` builds (the same call ``quantrt.from_pretrained``
makes). transformers then loads everything else itself (norms, embeddings, dense layers) with its
own ``device_map`` and dtype rules: quantrt keeps only what is quantized.

One adjustment to transformers is needed, and made here once: a checkpoint that carries its own
``quantization_config`` (GPTQ, AWQ, ...) makes transformers refuse a config of another class
("The model is quantized with GPTQConfig but you are passing a QuantrtConfig"). Asking for quantrt
explicitly means quantrt reads that config, so ``merge_quantization_configs`` is wrapped to return
the QuantrtConfig (keeping the checkpoint's own under ``checkpoint_config``); every other case
goes to transformers' own merge unchanged. GGUF files stay on ``quantrt.from_pretrained``:
transformers refuses any quantization config beside ``gguf_file``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from transformers.quantizers import HfQuantizer, register_quantization_config, register_quantizer
from transformers.quantizers.auto import (
    AUTO_QUANTIZATION_CONFIG_MAPPING,
    AUTO_QUANTIZER_MAPPING,
    AutoHfQuantizer,
)
from transformers.utils.quantization_config import QuantizationConfigMixin

from ..env import Overrides

METHOD = "quantrt"


class QuantrtConfig(QuantizationConfigMixin):
    """Load with quantrt's kernels. The fields are the dispatch overrides (the QUANTRT_* variables:
    ``backend``, ``kernel``, ``disabled_kernels``, ``fallback``); None leaves the environment's."""

    def __init__(
        self,
        backend: str | None = None,
        kernel: str | None = None,
        disabled_kernels: list[str] | None = None,
        fallback: str | None = None,
        checkpoint_config: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self.quant_method = METHOD
        self.backend, self.kernel, self.fallback = backend, kernel, fallback
        self.disabled_kernels = list(disabled_kernels or [])
        self.checkpoint_config = checkpoint_config

    def overrides(self) -> Overrides:
        env = Overrides.from_env()
        env_vars = {
            "QUANTRT_BACKEND": self.backend or env.backend or "",
            "QUANTRT_KERNEL": self.kernel or "",
            "QUANTRT_DISABLE_KERNELS": ",".join(sorted({*env.disabled, *self.disabled_kernels})),
            "QUANTRT_CAPABILITIES": env.capabilities or "",
            "QUANTRT_FALLBACK": self.fallback or env.fallback,
        }
        ov = Overrides.from_env(env_vars)
        if not self.kernel:  # keep the environment's forced kernel(s)
            ov = Overrides(
                ov.backend, env.kernel, env.kernel_by_scheme, ov.disabled, ov.capabilities, ov.fallback
            )
        return ov

    def to_dict(self) -> dict[str, Any]:
        return {
            "quant_method": METHOD,
            "backend": self.backend,
            "kernel": self.kernel,
            "disabled_kernels": self.disabled_kernels,
            "fallback": self.fallback,
            "checkpoint_config": self.checkpoint_config,
        }


class QuantrtHfQuantizer(HfQuantizer):
    """Replaces the checkpoint's quantized layers before transformers loads the rest."""

    requires_calibration = False

    def __init__(self, quantization_config: QuantrtConfig, **kwargs: Any) -> None:
        super().__init__(quantization_config, **kwargs)
        self.pre_quantized = True
        self.report: Any = None
        self.dtype: Any = None

    def preprocess_model(self, model: Any, dtype: Any = None, **kwargs: Any) -> Any:
        """transformers' own keeps ``dtype`` to itself; the layers need it for their activations."""
        self.dtype = dtype
        return super().preprocess_model(model, dtype=dtype, **kwargs)

    def _process_model_before_weight_loading(self, model: Any, **kwargs: Any) -> Any:
        from ..checkpoint import open_checkpoint
        from .loader import ModelLoader

        files = kwargs.get("checkpoint_files") or []
        if not files:
            raise ValueError("quantrt: transformers named no checkpoint files to load")
        ckpt = open_checkpoint(Path(files[0]).parent)
        device = _device(kwargs.get("device_map"))
        dtype = self.dtype if isinstance(self.dtype, torch.dtype) else ckpt.default_act_dtype
        loader = ModelLoader(
            model,
            ckpt,
            device=device,
            dtype=dtype,
            overrides=self.quantization_config.overrides(),
            quantized_only=True,
        )
        # transformers builds the model under a meta-device and model-dtype default; quantrt's
        # loading reads real tensors, so it runs under the plain defaults
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.float32)
        try:
            with torch.device("cpu"):
                self.report = loader.run()
        finally:
            torch.set_default_dtype(default)
        ignore = set(model._keys_to_ignore_on_load_unexpected or [])
        ignore.update(f"^{re.escape(n)}$" for n in loader.consumed)
        ignore.update(f"^{re.escape(n)}$" for n in ckpt.reader.ignored())
        # transformers renames per-expert tensors to the experts module's fused names before it
        # checks them: every name under an experts module quantrt replaced was read by quantrt
        ignore.update(f"^{re.escape(n)}\\." for n in loader.replaced_experts)
        model._keys_to_ignore_on_load_unexpected = ignore
        return model

    def _process_model_after_weight_loading(self, model: Any, **kwargs: Any) -> Any:
        """transformers may have replaced a QuantLinear's bias parameter while loading it: the
        kernel's bias is read from the parameter again."""
        from ..layers import QuantLinear

        for module in model.modules():
            if isinstance(module, QuantLinear) and module.bias is not None:
                keep = not (module.parallel == "row" and module.tp_rank > 0)
                module._bias = module.bias.data if keep else None
        model.quantrt = self.report
        return model

    def param_needs_quantization(self, model: Any, param_name: str, **kwargs: Any) -> bool:
        return False

    def is_serializable(self, safe_serialization: Any = None) -> bool:
        return False

    @property
    def is_trainable(self) -> bool:
        return False

    @property
    def is_compileable(self) -> bool:
        return True


def _device(device_map: Any) -> torch.device:
    """One device for the quantized layers, from transformers' ``device_map`` argument."""
    if device_map is None:
        return torch.device("cpu")
    if isinstance(device_map, dict):
        places = {str(v) for v in device_map.values()}
        if len(places) != 1:
            raise ValueError(
                f"quantrt: device_map spreads the model over {sorted(places)}; quantrt layers take one device "
                "(use tensor parallelism through quantrt.from_pretrained(tp=...) to spread a model)"
            )
        device_map = next(iter(device_map.values()))
    if device_map == "auto":
        return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if isinstance(device_map, int):
        return torch.device("cuda", device_map)
    return torch.device(device_map)


def _merge(cls: Any, quantization_config: Any, quantization_config_from_args: Any) -> Any:
    if isinstance(quantization_config_from_args, QuantrtConfig):
        own = quantization_config if isinstance(quantization_config, dict) else quantization_config.to_dict()
        quantization_config_from_args.checkpoint_config = dict(own)
        return quantization_config_from_args
    return _ORIGINAL_MERGE(quantization_config, quantization_config_from_args)


def register() -> None:
    """Register with transformers (idempotent: importing this module already did)."""
    global _ORIGINAL_MERGE
    for mapping, cls, reg in (
        (AUTO_QUANTIZATION_CONFIG_MAPPING, QuantrtConfig, register_quantization_config),
        (AUTO_QUANTIZER_MAPPING, QuantrtHfQuantizer, register_quantizer),
    ):
        if METHOD not in mapping:
            reg(METHOD)(cls)
        elif mapping[METHOD] is not cls:  # this module imported afresh (importlib.reload)
            mapping[METHOD] = cls
    current = AutoHfQuantizer.__dict__["merge_quantization_configs"]
    if getattr(current, "__func__", None) is not _merge:
        _ORIGINAL_MERGE = AutoHfQuantizer.merge_quantization_configs
        AutoHfQuantizer.merge_quantization_configs = classmethod(_merge)


_ORIGINAL_MERGE: Any = None
register()
