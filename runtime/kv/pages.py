"""One attention layer's KV cache in pages: what each scheme stores per token, and the store itself.

A cache is a pool of ``num_blocks`` blocks of ``block_size`` token slots; a sequence owns blocks
through its row of a block table, so slot ``block * block_size + offset`` holds one token. Each
scheme stores a few *planes* per token and KV head (:func:`kv_planes`), each a tensor
``[num_blocks, block_size, num_kv_heads, *shape]``; static per-layer scales (``tensor``/``head``
granularity) live beside the planes. A contiguous cache is the same pool with the identity block
table (sequence ``b`` owns blocks ``b * n .. b * n + n - 1``), so one set of kernels reads both.

The torch codec here is the cache's reference behaviour (quantize on write, dequantize on read);
backends write and read the same bits (``backends/triton/kv_*`` on CUDA).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import QuantrtError
from ..reference import kv as kv_ref
from ..reference import turboquant as tq
from ..schemes import KVCacheScheme, KVScheme, TurboQuantScheme

_STORE = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2, "int8": torch.int8}


class KVCacheError(QuantrtError, ValueError):
    """A KV cache asked to hold what its scheme or its size cannot."""


@dataclass(frozen=True)
class Plane:
    """One stored tensor per token and KV head: its name, trailing shape and element type."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    def nbytes(self) -> int:
        n = torch.empty((), dtype=self.dtype).element_size()
        for s in self.shape:
            n *= s
        return n


def check_scheme(scheme: KVScheme | None, head_dim: int) -> str | None:
    """Why a cache of this head_dim cannot hold the scheme, or None."""
    if isinstance(scheme, TurboQuantScheme):
        return tq.check_head_dim(scheme, head_dim)
    if isinstance(scheme, KVCacheScheme) and scheme.granularity == "group" and head_dim % scheme.group_size:
        return f"{scheme}: head_dim {head_dim} is not a multiple of the group size {scheme.group_size}"
    return None


def kv_planes(
    scheme: KVScheme | None, head_dim: int, dtype: torch.dtype = torch.bfloat16
) -> tuple[Plane, ...]:
    """The planes a scheme stores per token and KV head (``None``: the unquantized cache)."""
    d = head_dim
    if scheme is None:
        return (Plane("k", (d,), dtype), Plane("v", (d,), dtype))
    if isinstance(scheme, KVCacheScheme):
        t = _STORE[scheme.dtype]
        out = [Plane("k", (d,), t), Plane("v", (d,), t)]
        if scheme.dynamic:
            g = 1 if scheme.granularity == "token" else d // scheme.group_size
            out += [Plane("k_scale", (g,), torch.float32), Plane("v_scale", (g,), torch.float32)]
        return tuple(out)
    if scheme.key_bits == 8:
        keys = [Plane("k", (d,), torch.float8_e4m3fn)]
    else:
        keys = [Plane("k", (d * scheme.key_bits // 8,), torch.uint8), Plane("k_norm", (), torch.float16)]
    vals = [
        Plane("v", (d * scheme.value_bits // 8,), torch.uint8),
        Plane("v_scale", (), torch.float16),
        Plane("v_zero", (), torch.float16),
    ]
    return tuple(keys + vals)


def bytes_per_token(
    scheme: KVScheme | None, num_kv_heads: int, head_dim: int, dtype: torch.dtype = torch.bfloat16
) -> int:
    """Bytes one token takes in one layer's cache (keys and values, every KV head; static per-layer
    scales left out: they do not grow with the context)."""
    return num_kv_heads * sum(p.nbytes() for p in kv_planes(scheme, head_dim, dtype))


# -- the torch codec (reference behaviour) ------------------------------------------------------


def encode(
    scheme: KVScheme | None,
    k: torch.Tensor,
    v: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Keys and values [..., H, D] -> the scheme's planes [..., H, *shape]."""
    if scheme is None:
        return {"k": k, "v": v}
    if isinstance(scheme, TurboQuantScheme):
        return {**tq.quantize_keys(k, scheme), **tq.quantize_values(v, scheme)}
    out: dict[str, torch.Tensor] = {}
    for name, x, s in (("k", k, k_scale), ("v", v, v_scale)):
        if scheme.dynamic:
            s = kv_ref.kv_scales(x, scheme)
            out[f"{name}_scale"] = s
        elif s is None:
            raise KVCacheError(f"{scheme}: a static scale is needed to write {name} (calibrate or load one)")
        out[name] = kv_ref.quantize_kv(x, scheme, s)
    return out


def decode(
    scheme: KVScheme | None,
    planes: dict[str, torch.Tensor],
    head_dim: int,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The scheme's planes [..., H, *shape] -> fp32 keys and values [..., H, D]."""
    if scheme is None:
        return planes["k"].float(), planes["v"].float()
    if isinstance(scheme, TurboQuantScheme):
        return tq.dequantize_keys(planes, scheme, head_dim), tq.dequantize_values(planes, scheme)
    ks = planes["k_scale"] if scheme.dynamic else k_scale
    vs = planes["v_scale"] if scheme.dynamic else v_scale
    return kv_ref.dequantize_kv(planes["k"], scheme, ks), kv_ref.dequantize_kv(planes["v"], scheme, vs)


def gather(flat: dict[str, torch.Tensor], slots: torch.Tensor) -> dict[str, torch.Tensor]:
    """Planes [slots, H, ...] -> the entries at ``slots`` (any shape), fp8 moved as bytes."""
    out = {}
    for n, p in flat.items():
        if p.dtype.is_floating_point and p.element_size() == 1:
            out[n] = p.view(torch.uint8)[slots].view(p.dtype)
        else:
            out[n] = p[slots]
    return out


# -- the store ---------------------------------------------------------------------------------


class KVPages:
    """One layer's paged KV store: the planes, the static scales, and quantize-on-write.

    ``k_scale``/``v_scale`` (fp32 ``[1]`` or ``[H]``) are given (from a checkpoint) or, left None
    for a static scheme, calibrated on the first write (the first prefill's amax).
    """

    def __init__(
        self,
        scheme: KVScheme | None,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str = "cpu",
        k_scale: torch.Tensor | None = None,
        v_scale: torch.Tensor | None = None,
    ) -> None:
        why = check_scheme(scheme, head_dim)
        if why:
            raise KVCacheError(why)
        if min(num_blocks, block_size, num_kv_heads, head_dim) <= 0:
            raise KVCacheError(
                f"a KV cache needs positive sizes, found {num_blocks} blocks of {block_size} slots, "
                f"{num_kv_heads} heads of {head_dim}"
            )
        self.scheme, self.dtype, self.device = scheme, dtype, torch.device(device)
        self.num_blocks, self.block_size = num_blocks, block_size
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim
        self.planes = {
            p.name: torch.zeros(
                num_blocks, block_size, num_kv_heads, *p.shape, dtype=p.dtype, device=self.device
            )
            for p in kv_planes(scheme, head_dim, dtype)
        }
        self._flat: dict[str, torch.Tensor] | None = None
        self.k_scale = self._scale(k_scale, "k")
        self.v_scale = self._scale(v_scale, "v")
        from .kernels import select_kv

        #: the kernels that write and read these pages, and why each candidate was or was not taken
        self.kernels, self.verdicts = select_kv(scheme, head_dim, dtype, self.device)

    @property
    def static(self) -> bool:
        """Whether the scheme has per-layer scales (tensor or head granularity)."""
        return isinstance(self.scheme, KVCacheScheme) and not self.scheme.dynamic

    def _scale(self, s: torch.Tensor | None, name: str) -> torch.Tensor | None:
        if s is None or not self.static:
            return None
        s = s.detach().to(device=self.device, dtype=torch.float32).reshape(-1)
        want = 1 if self.scheme.granularity == "tensor" else self.num_kv_heads  # type: ignore[union-attr]
        if s.numel() != want:
            raise KVCacheError(
                f"{self.scheme}: the {name} scale must hold {want} value(s), found {s.numel()}"
            )
        return s

    def calibrate(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Static scales from these keys and values' amax (those not given already)."""
        if not self.static:
            return
        if self.k_scale is None:
            self.k_scale = kv_ref.kv_scales(k, self.scheme).to(self.device)  # type: ignore[arg-type]
        if self.v_scale is None:
            self.v_scale = kv_ref.kv_scales(v, self.scheme).to(self.device)  # type: ignore[arg-type]

    def flat(self) -> dict[str, torch.Tensor]:
        """The planes viewed as [num_blocks * block_size, H, *shape] (slot-major): views made once
        (the planes are allocated once), as every decode and write asks for them."""
        if self._flat is None:
            self._flat = {n: p.flatten(0, 1) for n, p in self.planes.items()}
        return self._flat

    def write(self, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        """Quantize keys and values [N, H, D] into their slots [N] (a negative slot is skipped)."""
        if k.shape != v.shape or k.dim() != 3 or tuple(k.shape[1:]) != (self.num_kv_heads, self.head_dim):
            raise KVCacheError(
                f"KV write: expected keys and values [N, {self.num_kv_heads}, {self.head_dim}], "
                f"found {list(k.shape)} and {list(v.shape)}"
            )
        keep = slots.reshape(-1).to(k.device) >= 0
        if self.static and (self.k_scale is None or self.v_scale is None):
            if not bool(keep.any()):  # nothing stored: nothing to calibrate on yet
                return
            self.calibrate(k[keep], v[keep])  # calibrated on the tokens written, once
        if k.shape[0]:
            self.kernels.write(self, k, v, slots)

    def read(self, block_table: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of the first ``length`` tokens of each sequence, dequantized to the
        cache's dtype: [B, H, length, D] (prefill and fallbacks; decode reads pages directly)."""
        nb = -(-length // self.block_size)
        blocks = block_table[:, :nb].long()
        slots = blocks[:, :, None] * self.block_size + torch.arange(self.block_size, device=blocks.device)
        slots = slots.flatten(1)[:, :length]
        k, v = decode(self.scheme, gather(self.flat(), slots), self.head_dim, self.k_scale, self.v_scale)
        return k.to(self.dtype).transpose(1, 2), v.to(self.dtype).transpose(1, 2)

    def nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.planes.values())
