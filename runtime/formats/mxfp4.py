"""``quant_method: mxfp4``: gpt-oss checkpoints, whose MoE experts are MXFP4.

Per MoE layer: ``mlp.experts.gate_up_proj_blocks`` uint8 [E, 2I, H/32, 16], ``_scales`` uint8
(e8m0) [E, 2I, H/32], ``_bias`` [E, 2I], and the same for ``down_proj`` ([E, H, I/32, 16]).
The 2I rows interleave gate and up (row 2i is gate_i, 2i+1 is up_i), which gpt-oss's clamped
SwiGLU consumes as is. Each expert's matrix is listed as its own weight
(``...experts.<e>.gate_up_proj``, kind ``expert``) and dequantizes; running experts arrives with
MoE support. Everything else (attention, router, embeddings, lm_head) is stored dense.
"""

from __future__ import annotations

import torch

from ..errors import CheckpointError
from ..schemes import parse_scheme
from .base import FormatReader, LayerEntry, expect
from .fp4 import MXFP4Adapter

PROJECTIONS = ("gate_up_proj", "down_proj")


class GptOssMXFP4Reader(FormatReader):
    """MXFP4 MoE experts in gpt-oss's ``*_blocks`` / ``*_scales`` layout."""

    name = "mxfp4"

    def quantized_layers(self) -> dict[str, LayerEntry]:
        idx = self.index
        scheme = parse_scheme("w4a16-mxfp4")
        out: dict[str, LayerEntry] = {}
        for blocks in [n for n in idx.names() if n.endswith("_blocks")]:
            stem = blocks[: -len("_blocks")]
            proj = stem.rsplit(".", 1)[-1]
            if proj not in PROJECTIONS:
                raise CheckpointError(
                    f"{idx.where(blocks)}: unknown MXFP4 tensor; gpt-oss stores "
                    f"{', '.join(p + '_blocks' for p in PROJECTIONS)}"
                )
            expect(idx, blocks, None, (torch.uint8,), "e2m1 codes [E, N, K/32, 16]")
            shape = idx.shape(blocks)
            if len(shape) != 4 or shape[3] != 16:
                raise CheckpointError(
                    f"{idx.where(blocks)}: expected [experts, N, K/32, 16], found {list(shape)}"
                )
            E, N, kb, _ = shape
            if 0 in shape:  # a count no byte backs: 2^40 experts of nothing would be 2^40 layers
                raise CheckpointError(f"{idx.where(blocks)}: {list(shape)} holds no elements")
            K = kb * 32
            scales = f"{stem}_scales"
            expect(idx, scales, (E, N, kb), (torch.uint8,), "e8m0 scales [E, N, K/32]")
            bias = f"{stem}_bias" if f"{stem}_bias" in idx else None
            if bias is not None:
                expect(
                    idx, bias, (E, N), (torch.bfloat16, torch.float16, torch.float32), "expert bias [E, N]"
                )
            base = stem.rsplit(".", 1)[0]  # ...mlp.experts
            for e in range(E):
                prefix = f"{base}.{e}.{proj}"
                adapter = MXFP4Adapter("blocks", "scales", blocks_3d=True)
                sel = {"blocks": e, "scales": e, **({"bias": e} if bias else {})}
                out[prefix] = LayerEntry(
                    prefix,
                    scheme,
                    N,
                    K,
                    {"blocks": blocks, "scales": scales},
                    adapter,
                    kind="expert",
                    bias=bias,
                    select=sel,
                    notes=["gate_up rows interleave gate and up"] if proj == "gate_up_proj" else [],
                )
        return out
