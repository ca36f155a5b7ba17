"""FP4 weights: NVFP4 (compressed-tensors ``nvfp4-pack-quantized``, ModelOpt NVFP4) and MXFP4
(compressed-tensors ``mxfp4-pack-quantized``, Quark OCP MX, gpt-oss ``*_blocks``/``*_scales``).

Both store e2m1 codes two per byte, low nibble first, packed along K. NVFP4 adds an e4m3 scale
per 16 and a global fp32 scale per shard: compressed-tensors stores the global as a *divisor*
(``weight_global_scale = 448*6/amax``), ModelOpt as a *multiplier* (``weight_scale_2``); the
canonical form is the multiplier, one per fused slice, so shards with different globals (which
compressed-tensors' own compressor writes) stay exact. MXFP4 scales are e8m0 bytes per 32.
"""

from __future__ import annotations

import torch

from ..canonical import CanonicalWeight, canonical_specs
from ..errors import CheckpointError
from ..schemes import Scheme
from ..specs import TensorSpec
from .base import Stored, TensorIndex, check_finite, expect, stored_specs


class NVFP4Adapter:
    """NVFP4 tensors under a tool's names <-> canonical nvfp4."""

    def __init__(self, weight: str, scale: str, global_scale: str, input_scale: str, divisor: bool) -> None:
        self.weight, self.scale, self.global_scale, self.input_scale = (
            weight,
            scale,
            global_scale,
            input_scale,
        )
        self.divisor = divisor
        self.name = "nvfp4 (compressed-tensors)" if divisor else "nvfp4 (modelopt)"

    def tensor_specs(self, scheme: Scheme, N: int, K: int, num_slices: int = 1) -> dict[str, TensorSpec]:
        layout = {
            self.weight: Stored("qweight"),
            self.scale: Stored("scales"),
            self.global_scale: Stored("global_scale"),
            self.input_scale: Stored("input_global_scale"),
        }
        return stored_specs(canonical_specs(scheme, N, K, num_slices), N, K, layout)

    def _multiplier(self, t: torch.Tensor, name: str) -> torch.Tensor:
        t = t.float().reshape(-1)
        check_finite(t, name)
        if bool((t <= 0).any()):
            raise CheckpointError(f"{name}: global scales must be positive, found {t.tolist()}")
        return 1.0 / t if self.divisor else t

    def to_canonical(
        self, tensors: dict[str, torch.Tensor], scheme: Scheme, N: int, K: int, output_sizes: tuple[int, ...]
    ) -> CanonicalWeight:
        scales = tensors[self.scale]
        if not bool(torch.isfinite(scales.float()).all()):
            raise CheckpointError(f"{self.scale}: block scales hold NaN")
        out = {
            "qweight": tensors[self.weight].contiguous(),
            "scales": scales.contiguous(),
            "global_scale": self._multiplier(tensors[self.global_scale], self.global_scale).contiguous(),
        }
        if scheme.act is not None:
            out["input_global_scale"] = (
                self._multiplier(tensors[self.input_scale], self.input_scale).max().reshape(1)
            )
        return CanonicalWeight(scheme, N, K, out, output_sizes)


class MXFP4Adapter:
    """MXFP4 (OCP MX) tensors: e2m1 codes [N, K/2] (or gpt-oss's [N, K/32, 16]) and e8m0 scales [N, K/32]."""

    def __init__(self, weight: str, scale: str, blocks_3d: bool = False) -> None:
        self.weight, self.scale, self.blocks_3d = weight, scale, blocks_3d
        self.name = "mxfp4"

    def tensor_specs(self, scheme: Scheme, N: int, K: int, num_slices: int = 1) -> dict[str, TensorSpec]:
        layout = {
            self.weight: Stored("qweight", shape=(N, K // 32, 16) if self.blocks_3d else None),
            self.scale: Stored("scales"),
        }
        return stored_specs(canonical_specs(scheme, N, K, num_slices), N, K, layout)

    def to_canonical(
        self, tensors: dict[str, torch.Tensor], scheme: Scheme, N: int, K: int, output_sizes: tuple[int, ...]
    ) -> CanonicalWeight:
        q = tensors[self.weight].reshape(N, K // 2).contiguous()
        s = tensors[self.scale].contiguous()
        if bool((s == 255).any()):
            raise CheckpointError(f"{self.scale}: e8m0 code 255 is NaN ({int((s == 255).sum())} scales)")
        return CanonicalWeight(scheme, N, K, {"qweight": q, "scales": s}, output_sizes)


def fp4_shape(index: TensorIndex, prefix: str, weight: str, scale: str, group: int) -> tuple[int, int]:
    """N and K of a packed fp4 layer, with its scales checked against them."""
    w = f"{prefix}.{weight}"
    expect(index, w, None, (torch.uint8,), "e2m1 codes two per byte")
    N, half = index.shape(w)[0], index.shape(w)[-1]
    K = 2 * half * (index.shape(w)[1] if len(index.shape(w)) == 3 else 1)
    if K % group:
        raise CheckpointError(f"{index.where(w)}: K={K} is not a multiple of the {group}-element scale block")
    sname = f"{prefix}.{scale}"
    if sname not in index:
        raise CheckpointError(f"missing tensor {sname!r}")
    if tuple(index.shape(sname)) != (N, K // group):
        raise CheckpointError(
            f"{index.where(sname)}: expected shape [{N}, {K // group}] (one scale per {group} of K="
            f"{K}), found {list(index.shape(sname))}"
        )
    return N, K
