"""FP4 weights: NVFP4 (compressed-tensors ``nvfp4-pack-quantized``, ModelOpt NVFP4) and MXFP4
(compressed-tensors ``mxfp4-pack-quantized``, Quark OCP MX, gpt-oss ``*_blocks``/``*_scales``).

Both store e2m1 codes two per byte, low nibble first, packed along K. NVFP4 adds an e4m3 scale
per 16 and a global fp32 scale per shard: compressed-tensors stores the global as a *divisor*
(``weight_global_scale = 448*6/amax``), ModelOpt as a *multiplier* (``weight_scale_2``); the
canonical form is the multiplier, one per fused slice, so shards with different globals (which
compressed-tensors' own compressor writes) stay exact. MXFP4 scales are e8m0 bytes per 32.
"""

from __future__ import annotations

from fractions import Fraction

import torch

from ..canonical import CanonicalWeight
from ..errors import CheckpointError
from ..schemes import Scheme
from ..specs import TensorSpec
from .base import TensorIndex, check_finite, expect


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
        specs = {
            self.weight: TensorSpec(
                self.weight,
                (N, K // 2),
                torch.uint8,
                output_dim=0,
                input_dim=1,
                input_unit=Fraction(2),
                input_align=16,
            ),
            self.scale: TensorSpec(
                self.scale,
                (N, K // 16),
                torch.float8_e4m3fn,
                output_dim=0,
                input_dim=1,
                input_unit=Fraction(16),
                input_align=16,
            ),
            self.global_scale: TensorSpec(self.global_scale, (num_slices,), torch.float32, per_slice=True),
        }
        if scheme.act is not None:
            specs[self.input_scale] = TensorSpec(
                self.input_scale, (num_slices,), torch.float32, per_slice=True
            )
        return specs

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
        if self.blocks_3d:
            w = TensorSpec(
                self.weight,
                (N, K // 32, 16),
                torch.uint8,
                output_dim=0,
                input_dim=1,
                input_unit=Fraction(32),
                input_align=32,
            )
        else:
            w = TensorSpec(
                self.weight,
                (N, K // 2),
                torch.uint8,
                output_dim=0,
                input_dim=1,
                input_unit=Fraction(2),
                input_align=32,
            )
        s = TensorSpec(
            self.scale,
            (N, K // 32),
            torch.uint8,
            output_dim=0,
            input_dim=1,
            input_unit=Fraction(32),
            input_align=32,
        )
        return {self.weight: w, self.scale: s}

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
