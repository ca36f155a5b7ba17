"""Fused MoE experts on NVIDIA GPUs: the portable Triton grouped GEMM (``backends/triton/moe.py``)
with NVIDIA's tiles, one launch per projection over every expert.

- ``cuda.triton_moe_wna16``: int4/int8 weight-only, group or channel scales, symmetric or with
  zero-points, codes as canonical (nothing repacked), dequantized in the K loop;
- ``cuda.triton_moe_fp8``: W8A8 fp8 e4m3 with tensor or channel weight scales (activations per token,
  or per tensor, static or dynamic) and block fp8 (bn x bk weight blocks, 1 x bk activation groups);
- ``cuda.triton_moe_int8``: W8A8 int8, channel or tensor weight scales, the same activation modes;
- ``cuda.triton_moe_fp4``: NVFP4 / MXFP4 weight-only with 16-bit activations (a W4A4 NVFP4
  checkpoint runs as a labelled weight-only substitute).

One layout per weight, prepared once: canonical codes, scales in the scheme's exact storage dtype
(fp16/bf16) or fp32, per-tensor scales expanded to one per output row, int8 codes made signed.
Per-tensor activation scales (static, or dynamic) are per expert, as a linear layer per expert would
find them: calibrated ``input_scale`` per expert, or the amax of the rows routed to that expert. Those
activations are quantized once per assignment (:func:`quantize_per_expert`); per-token and per-group
ones once per input row.

Tiles come from a table keyed by rows per expert (``A / E``, A = M * top_k assignments), not by M:
decode (one row per active expert) and prefill need different tiles at the same M depending on E
and top_k. The table is ``tunings/moe_<arch>.json`` when a sweep wrote one (``bench/gpu_moe.py
--sweep``), else :data:`DEFAULT_TABLE` (hand-set after vLLM's fused_moe defaults, not measured).
``split_k_target``: programs to aim for in small buckets; K is split (fp32 atomics) when the active
tiles times N/block_n fall short of it. A call compares ``A`` with the bucket bounds; nothing tunes
at run time and nothing synchronises, so a whole MoE layer captures into a CUDA graph.

The routing sorted by expert and padded to the tile comes from one Triton launch
(``backends/triton/moe_align.py``) up to its bound on assignments, from ExpertBatch's torch ops
beyond it (prefill, where the GEMMs dominate); either way it is cached on the batch, so both
projections of a call share it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from functools import partial
from typing import Any, ClassVar

import torch

from quantrt.backends.triton import tile_table
from quantrt.backends.triton.w8a8_kernel import int8_w8a8_conditions
from quantrt.kernels import Kernel, Verdict
from quantrt.moe import CanonicalExperts, ExpertBatch, ExpertsStrategy, PreparedExperts
from quantrt.moe.prepared import QuantizedRows
from quantrt.prepared import ALL_M
from quantrt.specs import LayerSpec

from .policy import CUDA

Condition = tuple  # (holds, predicate, values) or (holds, predicate, values, note)

#: rows-per-expert bounds of the table's buckets (the keys of tile_table.KEYS)
ROWS_PER_EXPERT = (1, 16, 64, 256, 1 << 62)
KEYS = tile_table.KEYS

#: hand-set tiles per rows-per-expert bucket (vLLM's fused_moe defaults as the guide: BM 16 while
#: experts get a few rows, 64 with GROUP_M 8 beyond; K tiles of 128 for 8-bit and 4-bit codes)
DEFAULT_TABLE: dict[str, Any] = {
    "_note": (
        "Hand-set after H100 sweeps (bench/gpu_moe.py --sweep: Mixtral int4 at M=16 and 1024, Qwen3 int4 at "
        "M=16, fp8 at 1024; the transposed 'swap' product measured no faster there). "
        "Buckets: assignments per expert (A / E). Sections: weight_only (int4/int8 dequantized in the K "
        "loop), weight_only_fp4 (NVFP4/MXFP4), w8a8 (fp8/int8 codes, rowwise scales), fp8_block."
    ),
    "weight_only": {
        "1": dict(block_m=16, block_n=256, block_k=128, group_m=1, num_warps=8, num_stages=3, split_k_target=264),
        "16": dict(block_m=16, block_n=128, block_k=128, group_m=1, num_warps=4, num_stages=4, split_k_target=264),
        "64": dict(block_m=32, block_n=128, block_k=128, group_m=8, num_warps=4, num_stages=4),
        "256": dict(block_m=64, block_n=128, block_k=128, group_m=8, num_warps=4, num_stages=3),
        "large": dict(block_m=64, block_n=128, block_k=128, group_m=8, num_warps=4, num_stages=3),
    },
    "w8a8": {
        "1": dict(block_m=16, block_n=64, block_k=128, group_m=1, num_warps=4, num_stages=4, split_k_target=264),
        "16": dict(block_m=16, block_n=128, block_k=128, group_m=1, num_warps=4, num_stages=4, split_k_target=264),
        "64": dict(block_m=32, block_n=128, block_k=128, group_m=8, num_warps=4, num_stages=4),
        "256": dict(block_m=128, block_n=128, block_k=128, group_m=8, num_warps=4, num_stages=3),
        "large": dict(block_m=128, block_n=128, block_k=128, group_m=8, num_warps=4, num_stages=3),
    },
}  # fmt: skip
#: block fp8 starts from row-wise W8A8's tiles, but its per-K-tile scaling wants BM 64 from 64 rows
#: per expert on (BM 128 halved its speed on Mixtral at M=1024 on the H100, BM 32 lost to BM 64 at
#: M=256 on the H200) and four stages (the sweeps of bench/results/h100-2026-12-06-moe-sweeps-r6.json
#: and h200-2026-12-06-moe-sweep-block.json)
DEFAULT_TABLE["fp8_block"] = copy.deepcopy(DEFAULT_TABLE["w8a8"])
for _key in ("64", "256", "large"):
    DEFAULT_TABLE["fp8_block"][_key] = dict(
        block_m=64, block_n=128, block_k=128, group_m=8, num_warps=4, num_stages=4
    )
#: e2m1 codes take the weight-only tiles with four warps where int codes take eight: their decode
#: holds more registers per code (the same sweeps: eight warps were slower for NVFP4 at Mixtral
#: M=1 and Qwen3 M=16, 30% faster for int4 at Qwen3 M=16)
DEFAULT_TABLE["weight_only_fp4"] = copy.deepcopy(DEFAULT_TABLE["weight_only"])
DEFAULT_TABLE["weight_only_fp4"]["1"]["num_warps"] = 4

#: the largest split of K a small batch may take
MAX_SPLIT_K = 8
#: assignment rows x columns up to which an unsplit second projection sums its top_k rows in fp32
#: planes (16 MB) rather than rounding each row to the output dtype and summing after
COMBINE_MAX_ELEMENTS = 1 << 22
#: 4-bit codes are re-paired k with k + PAIR_SPAN (backends/triton/moe.py pair_nibbles); K tiles are
#: then multiples of 2 * PAIR_SPAN (smaller int4 groups pair within the group)
PAIR_SPAN = 32


def load_table(arch: str) -> dict[str, Any]:
    """``tunings/moe_<arch>.json`` section by section over :data:`DEFAULT_TABLE`."""
    table = copy.deepcopy(DEFAULT_TABLE)
    try:
        found = tile_table.load(CUDA.package, "moe", arch)
    except FileNotFoundError:
        return table
    for name, section in found.items():
        if isinstance(section, dict):
            table.setdefault(name, {}).update({k: v for k, v in section.items() if k in KEYS})
    return table


def ptx_decode_enabled() -> bool:
    """The 4-bit K loops decode with :mod:`.triton_decode`'s PTX (exact, about half the
    instructions per code of the portable decode; checked on an H100 by tests/gpu/test_moe_cuda.py);
    ``QUANTRT_MOE_PTX_DECODE=0`` takes the portable decode instead."""
    import os

    return os.environ.get("QUANTRT_MOE_PTX_DECODE", "").strip() != "0"


def _pow2_floor(v: int) -> int:
    return 1 << (max(1, v).bit_length() - 1)


def _next_pow2(v: int) -> int:
    return 1 if v <= 1 else 1 << (v - 1).bit_length()


@dataclass
class MoeLayout:
    """One projection's experts as the grouped GEMM reads them, and how a call runs them."""

    weights: Any  # backends.triton.moe.MoeWeights
    tiles: tuple[Any, ...]  # MoeTile per rows-per-expert bucket
    targets: tuple[int, ...]  # split_k_target per bucket (0: never split)
    bounds: tuple[int, ...]  # assignment bounds of the buckets: A <= bounds[i] -> tiles[i]
    act: str  # "none" | "token" | "group" | "expert"
    act_kind: str  # "fp8" | "int8" (quantized activations)
    in_scale: torch.Tensor | None  # fp32 [E]: static per-expert activation scales
    out_dtype: torch.dtype
    matmul: Any  # moe_matmul, bound at load so a call imports nothing
    quant: Any  # (per_token, per_token_group, per_expert) quantizers
    align: Any  # (takes, align_routing) of moe_align, bound at load as well
    decoders: Any = None  # the K loop's 4-bit decodes (PTX on NVIDIA GPUs; None: portable)
    mma: Any = None  # mma_moe.MmaExperts over the same lane-layout bytes: decode-sized batches, or None
    sum_rows: Any = None  # backends.triton.moe.sum_rows: a token's top_k rows summed (large batches)
    _split: dict[tuple[int, int], Any] = field(default_factory=dict)

    def tile(self, A: int) -> Any:
        """The tile for ``A`` assignments: its bucket's, K split when the active tiles (at most
        ``min(A, E)`` experts have rows) leave the GPU short of the bucket's target."""
        i = 0
        for b in self.bounds:
            if A <= b:
                break
            i += 1
        t = self.tiles[i]
        target = self.targets[i]
        if not target:
            return t
        w = self.weights
        programs = min(A, w.E) * (-(-w.N // t.block_n))
        split = min(MAX_SPLIT_K, -(-w.K // t.block_k), target // max(1, programs))
        if split <= 1:
            return t
        got = self._split.get((i, split))
        if got is None:
            from dataclasses import replace

            got = self._split[(i, split)] = replace(t, split_k=split)
        return got


def _run(
    lay: MoeLayout,
    x: torch.Tensor,
    batch: ExpertBatch,
    gather: bool,
    weighted: bool,
    bias: torch.Tensor | None,
    out: torch.Tensor | None,
    ws: Any,
    reduce_rows: int = 1,
) -> torch.Tensor:
    """The one strategy: quantize activations as the scheme says, then one grouped launch (of the
    tensor-core kernel for the few tokens it takes, where the layout has it)."""
    A = batch.A
    me = lay.mma
    if me is not None and batch.M <= me.max_tokens() and x.dtype == me.act:
        return _run_mma(lay, me, x, batch, gather, weighted, bias, out, reduce_rows)
    tile = lay.tile(A)
    sid, bexp, npad = _aligned(lay, batch, tile.block_m)
    order, offsets = batch.sorted()
    row_div = batch.top_k if gather else 1
    xs, mode = None, "none"
    act = lay.act
    if act == "token":
        x, xs = lay.quant[0](x, lay.act_kind)
        mode = "row"
    elif act == "group":
        if isinstance(x, QuantizedRows):  # activate_into made them (gated_group_quant)
            x, xs = x.codes, x.scales
        else:
            x, xs = lay.quant[1](x, lay.weights.block[1])
    elif act == "expert":
        x, xs = lay.quant[2](x, batch.ids, lay.weights.E, row_div, lay.act_kind, lay.in_scale)
        row_div, mode = 1, "expert"
    return lay.matmul(
        x, lay.weights, sid, bexp, npad, order, offsets, A, row_div, tile, lay.out_dtype,
        x_scale=xs, act_scale_mode=mode, topk_weights=batch.weights if weighted else None, bias=bias, out=out,
        decoders=lay.decoders, reduce_rows=reduce_rows,
    )  # fmt: skip


def _run_mma(
    lay: MoeLayout,
    me: Any,
    x: torch.Tensor,
    batch: ExpertBatch,
    gather: bool,
    weighted: bool,
    bias: torch.Tensor | None,
    out: torch.Tensor | None,
    reduce_rows: int,
) -> torch.Tensor:
    """One ``wna16_moe`` launch (:mod:`.mma_moe`); ``reduce_rows`` > 1 sums each token's rows after."""
    A = batch.A
    tile = me.tile(batch.M, A)
    sid, bexp, npad = _aligned(lay, batch, tile.xr)
    order, offsets = batch.sorted()
    direct = out is not None and reduce_rows == 1 and out.dtype == me.act
    y = me.run(
        tile, x, sid, bexp, npad, order, offsets, A, batch.top_k if gather else 1,
        batch.weights if weighted else None, bias, out if direct else None,
    )  # fmt: skip
    if reduce_rows > 1:
        y = lay.sum_rows(y, reduce_rows)
    if out is not None and not direct:
        return out.copy_(y)
    return y if y.dtype == lay.out_dtype else y.to(lay.out_dtype)


def _group_quantized(group: int, fused: Any, h: torch.Tensor, act: Any) -> QuantizedRows:
    """A block-fp8 second projection's input straight from the first's output: the gated activation
    and the per-token-group quantization in one launch (``moe_act.gated_group_quant``)."""
    codes, scales = fused(h, act.kind, group, act.alpha, act.limit)
    return QuantizedRows(codes, scales, h.dtype)


def _run_combined(
    lay: MoeLayout,
    x: torch.Tensor,
    batch: ExpertBatch,
    gather: bool,
    weighted: bool,
    bias: torch.Tensor | None,
    out: torch.Tensor | None,
    ws: Any,
) -> torch.Tensor:
    """The second projection summed over each token's top_k in the launch that sums the K splits
    (PreparedExperts.combine): one launch fewer than the sum after it, nothing rounded per row.
    Large unsplit batches, where one launch more is nothing and fp32 planes of every assignment
    row would double the intermediate's memory, take the bf16 rows and one summing launch
    (:func:`~quantrt.backends.triton.moe.sum_rows`) instead."""
    A, N = batch.A, lay.weights.N
    if lay.tile(A).split_k == 1 and A * N > COMBINE_MAX_ELEMENTS:
        return lay.sum_rows(_run(lay, x, batch, gather, weighted, bias, None, ws), batch.top_k)
    return _run(lay, x, batch, gather, weighted, bias, out, ws, reduce_rows=batch.top_k)


def _aligned(
    lay: MoeLayout, batch: ExpertBatch, block: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``batch.aligned(block)``, made by one Triton launch where it can run (a GPU, or the
    interpreter's tests) and the batch is small enough, rather than ExpertBatch's torch ops (one
    launch each, the fixed cost that dominates a decode step's MoE layer). The results go into the
    batch's caches, as ``aligned`` and ``sorted`` would put them, so the other projection and any
    other kernel reading the orders reuse them (the values are the same, element for element)."""
    got = batch._aligned.get(block)
    if got is not None:
        return got
    takes, align_routing = lay.align
    if not takes(batch.topk_ids):
        return batch.aligned(block)
    order, offsets, sid, bexp, npad = align_routing(batch.topk_ids, batch.E, block)
    if batch._sorted is None:
        batch._sorted = (order, offsets)
    got = batch._aligned[block] = (sid, bexp, npad)
    return got


def _describe(lay: MoeLayout) -> str:
    parts = []
    for key, t, tgt in zip(KEYS, lay.tiles, lay.targets):
        name = "<=" + key if key != "large" else ">256"
        parts.append(
            f"{name}: BM{t.block_m} BN{t.block_n} BK{t.block_k} G{t.group_m}"
            + (" splitk" if tgt else "")
            + (" swap" if t.swap else "")
        )
    quant = {"none": "", "token": "token quant + ", "group": "group quant + ", "expert": "expert quant + "}
    ptx = " with PTX 4-bit decode" if lay.decoders is not None and lay.weights.pair else ""
    text = f"{quant[lay.act]}triton grouped GEMM{ptx} (rows/expert {'; '.join(parts)})"
    if lay.mma is not None:
        text = f"CUDA mma grouped for <= {lay.mma.max_tokens()} tokens, then {text}"
    return text


def _check(*conditions: Condition) -> Verdict:
    """The first failing condition as a Verdict (a 4th element is the note), else yes."""
    for c in conditions:
        if not c[0]:
            return Verdict.no(c[1], c[3] if len(c) > 3 else "", **c[2])
    return Verdict.yes()


def _device(caps: Any) -> list[Condition]:
    return [
        ((caps.sm or 0) >= 80, "sm >= 80", {"sm": caps.sm}),
        (
            "triton" in caps.libraries,
            "triton importable (it builds the kernel)",
            {"libraries": caps.libraries},
        ),
    ]


def _per_row(scales: torch.Tensor, weight: CanonicalExperts, granularity: str) -> torch.Tensor:
    """Tensor (per slice) or channel scales as fp32 [E, N]."""
    s = scales.float()
    if granularity == "tensor":
        sizes = torch.tensor(weight.output_sizes, device=s.device)
        idx = torch.repeat_interleave(torch.arange(len(weight.output_sizes), device=s.device), sizes)
        return s.reshape(weight.E, -1)[:, idx].contiguous()
    return s.reshape(weight.E, weight.N).contiguous()


class CudaTritonMoe(Kernel):
    """The fused MoE family (its kernels differ in the schemes they take and how they prepare)."""

    ops = ("grouped",)
    #: the table section of the kernel's tiles
    section: ClassVar[str] = "weight_only"

    def _prepared(
        self,
        weights: Any,
        spec: LayerSpec,
        act: str = "none",
        act_kind: str = "fp8",
        in_scale: Any = None,
        section: str | None = None,
        mma: Any = None,
    ) -> PreparedExperts:
        from quantrt.backends.triton import act_quant, moe_align
        from quantrt.backends.triton.moe import MoeTile, moe_matmul, quantize_per_expert, sum_rows
        from quantrt.backends.triton.moe_act import gated_activation, gated_group_quant

        table = load_table(CUDA.target(weights.w.device).arch)[section or self.section]
        min_bk = weights.min_block_k()
        tiles, targets = [], []
        for key in KEYS:
            c = dict(table[key])
            targets.append(int(c.pop("split_k_target", 0)))
            bn = max(16, min(c["block_n"], _next_pow2(weights.N)))
            bk = max(min_bk, min(c["block_k"], _next_pow2(weights.K)))
            if weights.kind == "int" and weights.group:
                bk = tile_table.fit(bk, weights.group)
            if weights.kind == "block":
                bn = tile_table.fit(bn, weights.block[0])
                bk = tile_table.fit(bk, weights.block[1])
            c.update(block_n=bn, block_k=bk)
            t = MoeTile(**c)
            t.check(min_bk)
            tiles.append(t)
        E = weights.E
        layout = MoeLayout(
            weights, tuple(tiles), tuple(targets), tuple(b * E for b in ROWS_PER_EXPERT[:-1]), act, act_kind,
            in_scale, spec.output_dtype, moe_matmul,
            (act_quant.quantize_per_token, act_quant.quantize_per_token_group, quantize_per_expert),
            (moe_align.takes, moe_align.align_routing),
        )  # fmt: skip
        layout.mma = mma
        layout.sum_rows = sum_rows
        if weights.w.is_cuda and ptx_decode_enabled():
            from .triton_decode import e2m1_scaled, int4_minus

            layout.decoders = (int4_minus, e2m1_scaled)
        # the launcher also runs fp32 activations (IEEE dots): a layer prepared for them takes them
        # (the interpreter tests), though planning never picks these kernels for fp32
        extra = () if spec.act_dtype in self.act_dtypes else (spec.act_dtype,)
        return PreparedExperts(
            layout,
            [ExpertsStrategy(ALL_M, _describe(layout), _run)],
            E=E,
            K=spec.K_part,
            N=spec.N_part,
            out_dtype=spec.output_dtype,
            act_dtypes=(*self.act_dtypes, *extra),
            device=weights.w.device,
            kernel=self.name,
            activate=lambda h, act: gated_activation(h, act.kind, act.alpha, act.limit),
            combine=_run_combined,
            activate_into=None
            if act != "group"
            else partial(_group_quantized, weights.block[1], gated_group_quant),
        )


# -- integer weight-only ---------------------------------------------------------------------------


def _scale_dtype(scheme: Any, act: torch.dtype) -> torch.dtype:
    """Scales kept in the dtype the scheme stores them in (exact), fp32 otherwise or for fp32 layers."""
    if act == torch.float32:
        return torch.float32
    return {"fp16": torch.float16, "bf16": torch.bfloat16}.get(scheme.scale_dtype, torch.float32)


class CudaTritonMoeWNA16(CudaTritonMoe):
    name = "cuda.triton_moe_wna16"
    description = (
        "fused MoE int4/int8 weight-only: sorted tokens, grouped Triton GEMM dequantizing in the K loop"
    )

    @classmethod
    def can_implement(cls, spec: LayerSpec, caps: Any) -> Verdict:
        s = spec.scheme
        G = s.group_size if s.granularity == "group" else None
        unit = 32 if s.bits == 4 else 16
        return _check(
            *_device(caps),
            (
                s.weight == "int" and s.bits in (4, 8),
                "4- or 8-bit integer weights",
                {"weight": s.weight, "bits": s.bits},
            ),
            (s.weight_only, "weight-only scheme", {"act": s.act}),
            (
                s.granularity in ("group", "channel"),
                "group or channel scales",
                {"granularity": s.granularity},
            ),
            (
                not s.act_order,
                "no act-order",
                {"act_order": s.act_order},
                "the grouped kernel reads K in order; act-order experts run per expert on the linear "
                "kernels' loop (cuda.triton_w4a16_experts)",
            ),
            (
                G is None or G % unit == 0,
                f"group size a multiple of {unit} (a K tile inside one group)",
                {"G": G},
            ),
        )

    def prepare(self, weight: CanonicalExperts, spec: LayerSpec) -> PreparedExperts:
        from quantrt.backends.triton.moe import MoeWeights, pair_nibbles

        s = weight.scheme
        E, N, K = weight.E, weight.N, weight.K
        sdt = _scale_dtype(s, spec.act_dtype)
        grouped = s.granularity == "group"
        scales = weight["scales"].to(sdt)
        zeros = weight.get("zeros")
        if not grouped:
            scales = scales.reshape(E, N)
            zeros = None if zeros is None else zeros.reshape(E, N)
        codes, pair = weight["qweight"].contiguous(), 0
        if s.bits == 4:
            pair = min(PAIR_SPAN, s.group_size // 2) if grouped else PAIR_SPAN
            codes = pair_nibbles(codes, K, pair)
        w = MoeWeights(
            "int", codes, scales.contiguous(), E, N, K,
            zeros=None if zeros is None else zeros.to(sdt).contiguous(), bits=s.bits,
            group=s.group_size if grouped else 0, pair=pair,
        )  # fmt: skip
        return self._prepared(w, spec)


# -- fp8 and int8 W8A8 -----------------------------------------------------------------------------


def _fp8_units(caps: Any) -> Condition:
    return (
        (caps.sm or 0) >= 89 and "fp8_e4m3" in caps.matrix_types,
        "fp8 matrix units (sm >= 89)",
        {"sm": caps.sm, "arch": caps.arch},
    )


def _act_mode(scheme: Any) -> str:
    if scheme.act_granularity == "token_group":
        return "group"
    if scheme.act_granularity == "token":
        return "token"
    return "expert"  # per tensor, static or dynamic: one scale per expert


def _static_scales(weight: CanonicalExperts) -> torch.Tensor | None:
    """Each expert's static activation scale, fp32 [E] (the max over fused slices, as the reference)."""
    s = weight.get("input_scale")
    if s is None or weight.scheme.act_dynamic:
        return None
    return s.float().reshape(weight.E, -1).amax(1).contiguous()


class CudaTritonMoeFp8(CudaTritonMoe):
    name = "cuda.triton_moe_fp8"
    section = "w8a8"
    description = (
        "fused MoE fp8 W8A8 (tensor/channel/block weight scales): Triton activation quantization, grouped "
        "fp8 GEMM with the scales in the epilogue or per k-block"
    )

    @classmethod
    def can_implement(cls, spec: LayerSpec, caps: Any) -> Verdict:
        s = spec.scheme
        block = s.block or (16, 32)
        conds: list[Condition] = [
            *_device(caps),
            _fp8_units(caps),
            (s.weight == "fp8_e4m3", "fp8 e4m3 weights", {"weight": s.weight}),
            (s.act == "fp8_e4m3", "fp8 activations", {"act": s.act}),
            (
                s.granularity in ("tensor", "channel", "block"),
                "tensor, channel or block scales",
                {"granularity": s.granularity},
            ),
        ]
        if s.granularity == "block":
            conds += [
                (
                    s.act_granularity == "token_group" and s.act_group == block[1],
                    "activation groups as wide as a weight block",
                    {"act_granularity": s.act_granularity, "act_group": s.act_group, "block": s.block},
                ),
                (
                    block[0] % 16 == 0 and block[1] % 32 == 0,
                    "blocks of multiples of 16 rows and 32 inputs",
                    {"block": s.block},
                ),
                (
                    spec.K_part % block[1] == 0 or spec.k_full,
                    "this rank's K cut on block boundaries",
                    {"K_part": spec.K_part, "block": s.block},
                ),
            ]
        else:
            conds.append(
                (
                    s.act_granularity in ("token", "tensor"),
                    "activations per token or per tensor",
                    {"act_granularity": s.act_granularity},
                )
            )
        return _check(*conds)

    def prepare(self, weight: CanonicalExperts, spec: LayerSpec) -> PreparedExperts:
        from quantrt.backends.triton.moe import MoeWeights

        s = weight.scheme
        E, N, K = weight.E, weight.N, weight.K
        q = weight["qweight"].contiguous()
        if s.granularity == "block":
            w = MoeWeights("block", q, weight["scales"].float().contiguous(), E, N, K, block=tuple(s.block))
            return self._prepared(w, spec, "group", section="fp8_block")
        w = MoeWeights("rowwise", q, _per_row(weight["scales"], weight, s.granularity), E, N, K)
        return self._prepared(w, spec, _act_mode(s), "fp8", _static_scales(weight))


class CudaTritonMoeInt8(CudaTritonMoe):
    name = "cuda.triton_moe_int8"
    section = "w8a8"
    description = (
        "fused MoE int8 W8A8: Triton activation quantization, grouped int8 GEMM, scales in the epilogue"
    )

    @classmethod
    def can_implement(cls, spec: LayerSpec, caps: Any) -> Verdict:
        s = spec.scheme
        return _check(
            *_device(caps),
            *int8_w8a8_conditions(s, caps),
            (
                s.act_granularity in ("token", "tensor"),
                "activations per token or per tensor",
                {"act_granularity": s.act_granularity},
            ),
        )

    def prepare(self, weight: CanonicalExperts, spec: LayerSpec) -> PreparedExperts:
        from quantrt.backends.triton.moe import MoeWeights

        s = weight.scheme
        q = (weight["qweight"].to(torch.int16) - 128).to(torch.int8).contiguous()  # canonical offset 128
        w = MoeWeights(
            "rowwise",
            q,
            _per_row(weight["scales"], weight, s.granularity),
            weight.E,
            weight.N,
            weight.K,
            bits=8,
        )
        return self._prepared(w, spec, _act_mode(s), "int8", _static_scales(weight))


# -- NVFP4 / MXFP4 weight-only ---------------------------------------------------------------------


class CudaTritonMoeFp4(CudaTritonMoe):
    name = "cuda.triton_moe_fp4"
    section = "weight_only_fp4"
    description = (
        "fused MoE NVFP4/MXFP4 weight-only in the tensor-core kernel's lane layout: a CUDA mma launch over the "
        "active experts for a few tokens, a grouped Triton GEMM decoding e2m1 in its K loop beyond"
    )

    weight_only = True  # an activation-quantized scheme here is a weight-only substitute

    @classmethod
    def can_implement(cls, spec: LayerSpec, caps: Any) -> Verdict:
        s = spec.scheme
        G = s.group_size or 16
        return _check(
            *_device(caps),
            (s.family in ("nvfp4", "mxfp4"), "NVFP4 or MXFP4 weights", {"weight": s.weight}),
            (spec.K_part % G == 0, "K a multiple of the scale group", {"K_part": spec.K_part, "G": G}),
            (G in (16, 32, 64), "scale groups of 16, 32 or 64 (whole groups per lane chunk)", {"G": G}),
        )

    def prepare(self, weight: CanonicalExperts, spec: LayerSpec) -> PreparedExperts:
        """The lane layout of the tensor-core kernel (:mod:`.mma_moe`), read by both it (batches of
        a few tokens, where CuPy is there to build it) and the Triton grouped GEMM."""
        from quantrt.backends.triton.moe import LANE_CHUNK, MoeWeights

        from .mma_moe import lane_fp4_experts, mma_fp4_experts

        G = weight.scheme.group_size
        assert G is not None
        w, sz, cs = lane_fp4_experts(weight)
        E, n_pad, chunks = weight.E, sz.shape[2], w.shape[2]
        mw = MoeWeights(
            "fp4", w.view(E, n_pad, chunks * LANE_CHUNK // 2), sz.transpose(1, 2), E, weight.N, weight.K,
            row_scale=cs, group=G, scale_kind="e5m3", pair=LANE_CHUNK // 2, layout="lane",
        )  # fmt: skip
        mma = None
        if w.is_cuda and spec.act_dtype in (torch.float16, torch.bfloat16) and _has_cupy():
            mma = mma_fp4_experts(w, sz, cs, weight, spec.act_dtype)
        return self._prepared(mw, spec, mma=mma)


def _has_cupy() -> bool:
    import importlib.util

    return importlib.util.find_spec("cupy") is not None


FUSED_MOE_KERNELS = (CudaTritonMoeWNA16, CudaTritonMoeFp8, CudaTritonMoeInt8, CudaTritonMoeFp4)
