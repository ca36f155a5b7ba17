"""bitsandbytes checkpoints as transformers saves them; 8-bit here (4-bit arrives with formats II).

8-bit (LLM.int8) stores ``weight`` int8 [N, K] row-major, ``SCB`` fp32 [N] (per-row absmax) and
``weight_format`` (0 = row). quantrt reads it as weight-only int8 with per-row scales SCB/127
(scheme ``w8a16-int-ch-sym-sfp32``): LLM.int8's split of outlier activation columns into a
16-bit matmul is not reproduced, so activations stay 16-bit and the numerics are the weights'.
"""

from __future__ import annotations

import torch

from ..canonical import CanonicalWeight
from ..errors import CheckpointError
from ..schemes import Scheme, parse_scheme
from ..specs import TensorSpec
from .base import FormatReader, LayerEntry, check_finite, expect, match_rules, prefixes_with

INT8_SCHEME = parse_scheme("w8a16-int-ch-sym-sfp32")
#: bitsandbytes dequantizes as (q * SCB) * this fp32 constant (1/127 rounded)
INV_127 = 7.874015718698502e-3


class Bnb8Adapter:
    """bitsandbytes 8-bit tensors <-> canonical int8 (codes q + 128, scales SCB / 127)."""

    name = "bitsandbytes-8bit"

    def tensor_specs(self, scheme: Scheme, N: int, K: int, num_slices: int = 1) -> dict[str, TensorSpec]:
        return {
            "weight": TensorSpec("weight", (N, K), torch.int8, output_dim=0, input_dim=1),
            "SCB": TensorSpec("SCB", (N,), torch.float32, output_dim=0, row="replicate"),
        }

    def to_canonical(
        self, tensors: dict[str, torch.Tensor], scheme: Scheme, N: int, K: int, output_sizes: tuple[int, ...]
    ) -> CanonicalWeight:
        w, scb = tensors["weight"], tensors["SCB"].float()
        check_finite(scb, "SCB")
        q = w.contiguous().view(torch.uint8) ^ 0x80  # two's complement + 128: the unsigned 8-bit code
        scales = (scb * torch.tensor(INV_127, dtype=torch.float32)).reshape(N, 1)
        return CanonicalWeight(scheme, N, K, {"qweight": q, "scales": scales}, output_sizes)


class BitsandbytesReader(FormatReader):
    """``quant_method: bitsandbytes``."""

    name = "bitsandbytes"

    def quantized_layers(self) -> dict[str, LayerEntry]:
        if self.cfg("load_in_4bit", default=False) and not self.cfg("load_in_8bit", default=False):
            raise CheckpointError(
                f"{self.source}: bitsandbytes 4-bit (NF4/FP4) checkpoints arrive with the "
                "FP4/block formats; not supported yet"
            )
        if not self.cfg("load_in_8bit", default=False):
            raise CheckpointError(f"{self.source}: a bitsandbytes config sets load_in_8bit or load_in_4bit")
        skip = list(self.cfg("llm_int8_skip_modules", default=None) or [])
        out: dict[str, LayerEntry] = {}
        for prefix in prefixes_with(self.index, "SCB"):
            if any(match_rules(prefix, [s]) or prefix.endswith("." + s) or prefix == s for s in skip):
                raise CheckpointError(
                    f"{self.source}: {prefix} is in llm_int8_skip_modules but stores 8-bit tensors"
                )
            w = f"{prefix}.weight"
            expect(self.index, w, None, (torch.int8,), "bitsandbytes 8-bit weight")
            N, K = self.index.shape(w)
            expect(self.index, f"{prefix}.SCB", (N,), (torch.float32,), "per-row absmax")
            fmt = f"{prefix}.weight_format"
            if fmt in self.index:
                value = self.index.read(fmt).reshape(-1)
                if value.numel() != 1 or int(value[0]) != 0:
                    raise CheckpointError(
                        f"{self.index.where(fmt)}: only the row-major layout (0) is supported, "
                        f"found {value.tolist()}"
                    )
            bias = f"{prefix}.bias" if f"{prefix}.bias" in self.index else None
            out[prefix] = LayerEntry(
                prefix,
                INT8_SCHEME,
                N,
                K,
                {"weight": w, "SCB": f"{prefix}.SCB"},
                Bnb8Adapter(),
                bias=bias,
                notes=["LLM.int8 outlier decomposition not reproduced (weight-only)"],
            )
        return out
