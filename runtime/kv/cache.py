"""The quantized KV cache under a transformers model: a ``Cache`` whose layers hold :class:`KVPages`,
and an attention function that reads them directly.

``kv_cache(model, "fp8")`` returns a :class:`QuantKVCache` for ``model.generate(..., cache=...)``
or a forward pass, and switches the model's attention to ``quantrt_<base>`` (``<base>`` the
implementation it had: ``sdpa`` or ``eager``). That function serves one-token decode steps from the
quantized pages through :func:`~quantrt.kv.kernels.decode_attention`; the first prefill attends the
new keys and values as computed (they are quantized as they are stored, as inference engines do);
any other call (a prefill after cached tokens, a per-head mask, dropout) runs the base
implementation on the dequantized cache. Given plain tensors (another cache), it is the base.

Each layer's cache is one contiguous region per sequence in a paged pool (block table rows of
consecutive blocks), grown by doubling; ``max_cache_len`` preallocates it instead, with the length
kept in a device tensor, so a decode step can be captured in a CUDA graph.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from typing import Any

import torch

from ..errors import ConfigError
from ..schemes import KVCacheScheme, KVScheme, TurboQuantScheme, kv_scheme_from_name
from .kernels import decode_attention
from .pages import KVCacheError, KVPages, check_scheme

#: tokens a dynamic layer first allocates per sequence (then doubles)
FIRST_CAPACITY = 256
#: TurboQuant leaves this many first and last layers unquantized (vLLM's boundary protection)
TURBOQUANT_PROTECT = 2
#: the cache name for unquantized pages read by quantrt's own attention (the quantized caches'
#: baseline on the same kernels, and a cache CUDA graphs capture at any prompt length)
PAGED = "paged"


class KVRead:
    """What a layer's ``update`` hands the attention function in place of keys (or values): the
    layer, the tokens this call wrote and how many were cached before them."""

    __slots__ = ("layer", "new", "start")

    def __init__(self, layer: QuantKVLayer, new: torch.Tensor, start: int | None) -> None:
        self.layer, self.new, self.start = layer, new, start

    @property
    def shape(self) -> torch.Size:
        return self.new.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.new.dtype

    @property
    def device(self) -> torch.device:
        return self.new.device


def _layer_mixin() -> type:
    from transformers.cache_utils import CacheLayerMixin

    return CacheLayerMixin


class QuantKVLayer(_layer_mixin()):  # type: ignore[misc]
    """One attention layer's quantized cache (a transformers cache layer)."""

    is_sliding = False
    is_croppable = False

    def __init__(
        self,
        scheme: KVScheme | None,
        *,
        max_cache_len: int | None = None,
        block_size: int = 16,
        k_scale: torch.Tensor | None = None,
        v_scale: torch.Tensor | None = None,
        fused: bool = True,
    ) -> None:
        super().__init__()
        self.scheme, self.block_size, self.fused = scheme, block_size, fused
        self.max_cache_len = max_cache_len
        self.is_compileable = max_cache_len is not None
        self._scales = (k_scale, v_scale)
        self.pages: KVPages | None = None
        self.block_table: torch.Tensor | None = None
        self.cumulative_length: int | torch.Tensor = (
            0 if max_cache_len is None else torch.zeros((), dtype=torch.long)
        )
        self._lens: torch.Tensor | None = None

    def __repr__(self) -> str:
        return f"QuantKVLayer({self.scheme or 'unquantized'})"

    # -- storage --------------------------------------------------------------------------------

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        B, H, T, D = key_states.shape
        self.device, self.dtype = key_states.device, key_states.dtype
        self.batch, self.heads, self.head_dim = B, H, D
        cap = self.max_cache_len or max(FIRST_CAPACITY, T)
        self._allocate(-(-cap // self.block_size))
        if isinstance(self.cumulative_length, torch.Tensor):
            self.cumulative_length = self.cumulative_length.to(self.device)
        self.is_initialized = True

    def _allocate(self, blocks_per_seq: int, old: KVPages | None = None) -> None:
        k_scale, v_scale = self._scales if old is None else (old.k_scale, old.v_scale)
        pages = KVPages(
            self.scheme, self.batch * blocks_per_seq, self.block_size, self.heads, self.head_dim,
            dtype=self.dtype, device=self.device, k_scale=k_scale, v_scale=v_scale,
        )  # fmt: skip
        if old is not None:  # each sequence's tokens move to the front of its (larger) region
            n = old.num_blocks // self.batch
            for name, dst in pages.planes.items():
                dst.view(self.batch, blocks_per_seq, *dst.shape[1:])[:, :n] = old.planes[name].view(
                    self.batch, n, *dst.shape[1:]
                )
        self.pages = pages
        self.block_table = torch.arange(pages.num_blocks, device=self.device, dtype=torch.int32).view(
            self.batch, blocks_per_seq
        )

    @property
    def capacity(self) -> int:
        assert self.block_table is not None
        return self.block_table.shape[1] * self.block_size

    # -- the transformers layer interface --------------------------------------------------------

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[Any, Any]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if key_states.shape[0] != self.batch or key_states.shape[1] != self.heads:
            raise KVCacheError(
                f"KV cache layer holds {self.batch} sequences of {self.heads} KV heads, the model wrote "
                f"{list(key_states.shape)}"
            )
        T = key_states.shape[-2]
        static = isinstance(self.cumulative_length, torch.Tensor)
        start: Any = self.cumulative_length
        if not static and start + T > self.capacity:
            need = -(-(start + T) // self.block_size)
            self._allocate(max(need, 2 * self.block_table.shape[1]), self.pages)  # type: ignore[union-attr]
        pos = torch.arange(T, device=self.device) + start
        bt = self.block_table
        assert bt is not None and self.pages is not None
        slots = bt[:, pos // self.block_size].long() * self.block_size + pos % self.block_size
        k = key_states.transpose(1, 2).reshape(-1, self.heads, self.head_dim)
        v = value_states.transpose(1, 2).reshape(-1, self.heads, self.head_dim)
        self.pages.write(k, v, slots.reshape(-1))
        if static:
            self.cumulative_length.add_(T)
            self._lens = self.cumulative_length.to(torch.int32).expand(self.batch)
        else:
            self.cumulative_length = start + T
            self._lens = None
        if self.fused:
            first = None if static else start
            return KVRead(self, key_states, first), KVRead(self, value_states, first)
        if not static and start == 0:  # the first prefill attends the keys as computed
            return key_states, value_states
        return self.dequantized()

    def seq_lens(self) -> torch.Tensor:
        """Every sequence's cached length, int32 [B] on the cache's device."""
        if self._lens is None:
            self._lens = torch.full(
                (self.batch,), int(self.cumulative_length), dtype=torch.int32, device=self.device
            )
        return self._lens

    def max_len(self) -> int:
        """The most tokens a decode call may read (the capacity when preallocated)."""
        if isinstance(self.cumulative_length, torch.Tensor):
            return self.capacity
        return int(self.cumulative_length)

    def dequantized(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values [B, H, L, D] in the model's dtype (L the length, or the capacity when
        preallocated: the mask covers the rest)."""
        assert self.pages is not None and self.block_table is not None
        return self.pages.read(self.block_table, self.max_len())

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        if self.max_cache_len is not None:
            return self.max_cache_len, 0
        return self.get_seq_length() + query_length, 0

    def get_seq_length(self) -> int:
        if not self.is_initialized:
            return 0
        return (
            self.cumulative_length
        )  # an int, or a device tensor when preallocated (as transformers' static layers)

    def get_max_length(self) -> int:
        return self.max_cache_len or -1

    def reset(self) -> None:
        if isinstance(self.cumulative_length, torch.Tensor):
            self.cumulative_length.zero_()
        else:
            self.cumulative_length = 0
        self._lens = None

    def nbytes(self) -> int:
        return self.pages.nbytes() if self.pages is not None else 0


def _cache_base() -> type:
    from transformers.cache_utils import Cache

    return Cache


class QuantKVCache(_cache_base()):  # type: ignore[misc]
    """A transformers ``Cache`` of :class:`QuantKVLayer` (one per decoder layer)."""

    def __init__(self, layers: list[QuantKVLayer], scheme: KVScheme | None) -> None:
        super().__init__(layers=layers)
        self.scheme = scheme

    def nbytes(self) -> int:
        """Bytes the cache's pages hold now (every layer)."""
        return sum(layer.nbytes() for layer in self.layers)

    def describe(self) -> dict[str, Any]:
        kinds: dict[str, int] = {}
        for layer in self.layers:
            kinds[str(layer.scheme or "unquantized")] = kinds.get(str(layer.scheme or "unquantized"), 0) + 1
        first = next((layer for layer in self.layers if layer.pages is not None), None)
        quantized = next((layer for layer in self.layers if layer.pages is not None and layer.scheme), first)
        return {
            "scheme": str(self.scheme or "unquantized"),
            "layers": kinds,
            "kernels": quantized.pages.kernels.name if quantized is not None else None,
            "candidates": {n: v.reason for n, v in quantized.pages.verdicts} if quantized is not None else {},
            "bytes": self.nbytes(),
        }


# -- building one for a model ---------------------------------------------------------------------


def resolve_scheme(model: Any, scheme: str | KVScheme | None) -> KVScheme | None:
    """``"auto"``: the checkpoint's own KV-cache scheme (where it stores KV scales), else None;
    ``"none"``/``"bf16"``/None: unquantized; otherwise a scheme name or vLLM ``--kv-cache-dtype``."""
    if scheme is None or isinstance(scheme, KVCacheScheme | TurboQuantScheme):
        return scheme
    text = scheme.strip().lower()
    if text in ("none", "auto", "bf16", "bfloat16", "fp16", "float16"):
        if text != "auto":
            return None
        scales = _checkpoint_scales(model)
        return next(iter(scales.values())).scheme if scales else None
    return kv_scheme_from_name(text)


def _checkpoint_scales(model: Any) -> dict[int, Any]:
    report = getattr(model, "quantrt", None)
    return dict(getattr(report, "kv_scales", None) or {})


def kv_cache(
    model: Any,
    scheme: str | KVScheme | None = "auto",
    *,
    max_cache_len: int | None = None,
    block_size: int = 16,
    protect: int | None = None,
    fused: bool = True,
) -> QuantKVCache | None:
    """A quantized KV cache for ``model`` (None when ``scheme`` resolves to no quantization;
    ``"paged"``: unquantized pages read by quantrt's attention).

    Static schemes take the checkpoint's k/v scales where it stores them for this scheme and are
    calibrated on the first prefill otherwise. ``protect``: first and last layers left unquantized
    (default 2 for TurboQuant, as vLLM does, 0 otherwise). ``fused``: switch the model's attention
    to quantrt's, which reads the pages directly (False: layers hand back dequantized tensors).
    """
    paged = isinstance(scheme, str) and scheme.strip().lower() == PAGED
    s = None if paged else resolve_scheme(model, scheme)
    if s is None and not paged:
        return None
    config = model.config.get_text_config(decoder=True)
    n = int(config.num_hidden_layers)
    kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
    if not kinds <= {"full_attention", "sliding_attention"}:
        raise ConfigError(
            f"{s}: a quantized KV cache needs attention layers only, this model has {sorted(kinds)}"
        )
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
    why = check_scheme(s, head_dim)
    if why:
        raise ConfigError(why)
    keep = TURBOQUANT_PROTECT if protect is None and isinstance(s, TurboQuantScheme) else (protect or 0)
    keep = min(keep, n // 2)
    unquantized = set(range(keep)) | set(range(n - keep, n))
    scales = _checkpoint_scales(model)
    layers = []
    for i in range(n):
        ks = scales.get(i)
        use = ks is not None and ks.scheme == s
        layers.append(
            QuantKVLayer(
                None if i in unquantized else s,
                max_cache_len=max_cache_len,
                block_size=block_size,
                k_scale=ks.k_scale if use else None,
                v_scale=ks.v_scale if use else None,
                fused=fused,
            )
        )
    if fused:
        install_attention(model)
    return QuantKVCache(layers, s)


# -- the attention function -------------------------------------------------------------------------


def _base_function(module: Any, base: str) -> Callable[..., Any]:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if base == "eager":
        fn = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
        if fn is None:
            raise ConfigError(
                f"{type(module).__name__}: no eager_attention_forward in {type(module).__module__}"
            )
        return fn
    return ALL_ATTENTION_FUNCTIONS[base]


def _attention(base: str) -> Callable[..., Any]:
    resolved: dict[type, Callable[..., Any]] = {}  # per attention class, found once, not per call

    def attention(
        module: Any,
        query: torch.Tensor,
        key: Any,
        value: Any,
        attention_mask: torch.Tensor | None,
        scaling: float | None = None,
        dropout: float = 0.0,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        fn = resolved.get(type(module))
        if fn is None:
            fn = resolved[type(module)] = _base_function(module, base)
        if not isinstance(key, KVRead):
            return fn(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
        layer = key.layer
        B, _, Tq, D = query.shape
        scale = scaling if scaling is not None else D**-0.5
        if Tq == 1 and not dropout and kwargs.get("position_bias") is None:
            mask = _row_mask(attention_mask, B)
            if mask is not False:
                out = decode_attention(
                    query[:, :, 0],
                    layer.pages,
                    layer.block_table,
                    layer.seq_lens(),
                    layer.max_len(),
                    scale=scale,
                    window=kwargs.get("sliding_window"),
                    softcap=kwargs.get("softcap"),
                    sinks=kwargs.get("s_aux"),
                    mask=mask,
                )
                return out[:, None], None
        if key.start == 0:  # the first prefill: the keys and values as computed
            k, v = key.new, value.new
        else:
            k, v = layer.dequantized()
        return fn(module, query, k, v, attention_mask, scaling=scaling, dropout=dropout, **kwargs)

    return attention


def _row_mask(mask: torch.Tensor | None, batch: int) -> torch.Tensor | bool | None:
    """A decode step's mask as [B, L] bool (True: attend), None when there is none, False when it
    is not one row per sequence (the caller falls back)."""
    if mask is None:
        return None
    if mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[2] != 1:
        return False
    m = mask[:, 0, 0]
    if m.dtype != torch.bool:
        m = m == 0  # an additive mask: 0 where attended
    return m.expand(batch, m.shape[-1])


_NAME = re.compile(r"^quantrt_(sdpa|eager)$")


def install_attention(model: Any) -> str:
    """Register ``quantrt_<base>`` with transformers and switch ``model`` to it; returns the name."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    current = model.config._attn_implementation or "sdpa"
    m = _NAME.match(current)
    base = m.group(1) if m else current
    if base not in ("sdpa", "eager"):
        raise ConfigError(
            f"a quantized KV cache runs over sdpa or eager attention; this model uses {current!r} "
            "(load it with attn_implementation='sdpa')"
        )
    name = f"quantrt_{base}"
    if name not in ALL_ATTENTION_FUNCTIONS:
        ALL_ATTENTION_FUNCTIONS.register(name, _attention(base))
        ALL_MASK_ATTENTION_FUNCTIONS.register(name, ALL_MASK_ATTENTION_FUNCTIONS[base])
    if current != name:
        model.set_attn_implementation(name)
    return name
