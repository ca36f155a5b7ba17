"""W4A16 and W8A16 on NVIDIA tensor cores: CUDA C++ (``kernels/wna16_mma.cu``) through CuPy.

Small M (decode) is bound by streaming the weights and by the instructions spent per weight
byte, so the weights are repacked once (``wna16_layout.py``) so that each lane's 16-byte load
holds its mma fragments' codes for a run of consecutive inputs, x arrives as 16-byte vectors
through the same asynchronous-copy ring, and for M <= 8 the operands swap so one mma serves 16
columns (M up to 64 as n8 parts). A block's warp groups split K and reduce through shared memory:
one launch per call, no workspace, no atomics; warps side by side over N share each chunk's x
slice, so x is read from L2 once per block rather than once per warp (at M = 16..64 it otherwise
outweighs the weights). Large M is bound by arithmetic, where cuBLAS is hard to beat: a CUDA pass
writes the dequantized weight slice by slice into a bounded scratch buffer and cuBLAS multiplies
it (the way exllama serves prefill). Launch shapes per M bucket and the M where the dense path
takes over come from ``tunings/wna16_mma_<arch>.json``; ``prepare`` compiles what it needs.

The kernel serves several weight formats, each built with its own ``CODE`` (integer codes here,
fp4 and code books in ``mma_codebook.py``, fp8 in ``mma_fp8.py``, GGUF in ``mma_gguf.py``): each kernel
class hands its operands and launch rows to :func:`prepare_mma`, which builds one
:class:`MmaLayout` and its strategies (one per launch shape, then dequant + cuBLAS).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from quantrt.backends.triton import tile_table
from quantrt.backends.triton.dense_slices import in_act_dtype
from quantrt.canonical import CanonicalWeight, act_order_perm
from quantrt.kernels import Kernel, Verdict, check
from quantrt.prepared import ALL_M, Prepared, Strategy
from quantrt.specs import LayerSpec

from .cupy_kernels import Launch, compile_all, function, stream
from .policy import CUDA
from .wna16_layout import KC, TG, group_params, repack_codes, wgmma_x_order
from .wna16_rules import wna16_conditions

SOURCE = "wna16_mma.cu"
WG_SOURCE = "wna16_wgmma.cu"  # Hopper only (sm_90a)
MMA_ARGS = 15  # wna16_mma: x, w, sz, bias, cs, book, y, M, K, ldx, ldy, N, Npad, chunks, shift
WG_ARGS = 12  # wna16_wgmma: x, w, sz, bias, y, M, ldx, ldy, N, Npad, chunks, shift
WG_N = (16, 32, 64, 128, 256)  # x rows per block the wgmma kernel is built for
DENSE_ARGS = 12  # wna16_dequant: w, sz, book, out, N, K, Npad, chunks, c_begin, c_count, ldo, shift
SMEM_LIMIT = 48 * 1024
MAX_SWAP_M = 64  # x rows as the mma's B operand: up to 8 n8 parts
MAX_WN = 16  # warps side by side over N per block
CT = {torch.float16: "__half", torch.bfloat16: "__nv_bfloat16"}
#: the kernels' CODE template argument for fp4 (e2m1) and 16-value code-book (LUT4) weights;
#: integer codes pass their width (4, 8)
E2M1 = 41
LUT4 = 42
Q4K = 43  # GGUF Q4_K: nibbles with llama.cpp's super-block heads as group parameters
Q80 = 44  # GGUF Q8_0: signed bytes plus 128, llama.cpp's fp16 block scale as the group parameter
#: GGUF Q4_0, Q4_1, Q5_0, Q5_1, Q5_K, Q6_K: low nibbles, the rest of each 32-input run as its parameter;
#: Q2_K, Q3_K: whole codes as nibbles, the run's sub-block scales (and offsets) as its parameter
Q40, Q41, Q50, Q51, Q5K, Q6K, Q2K, Q3K = 45, 46, 47, 48, 49, 50, 51, 52
#: fp8 weights as stored (e4m3, e5m2), an fp32 scale per group and column
F8E4, F8E5 = 53, 54
#: static shared memory the code book takes per code (LUT4: 256 pairs, one copy per bank)
BOOK_SMEM = {LUT4: 32 * 1024}

#: (codes in the canonical packing, group parameters as the kernel reads them, per-column factor
#: or None, LUT4 code book or None)
Operands = tuple[torch.Tensor, torch.Tensor, "torch.Tensor | None", "torch.Tensor | None"]
#: ``operands(weight, group, act)``: a format's :data:`Operands` (group None: per channel)
OperandsFn = Callable[[CanonicalWeight, "int | None", torch.dtype], Operands]
#: ``tile_rows(table)``: a format's launch rows from the tuning table
RowsFn = Callable[[dict[str, Any]], list[dict[str, Any]]]


def code_bits(code: int) -> int:
    """Bits per stored code: 8 for int8, fp8 and GGUF Q8_0, 4 for int4, fp4, code books and the
    GGUF nibble types (which share the 4-bit lane layout)."""
    return 8 if code in (8, Q80, F8E4, F8E5) else 4


def folds(code: int, bits: int) -> bool:
    """Codes the kernel can multiply as they are, each group's scale (and zero point) applied to
    its chunk sums in fp32: integers and fp8."""
    return code == bits or code in (F8E4, F8E5)


def groups_per_chunk(bits: int, group: int | None) -> int:
    """1 when a group spans a power of two of whole chunks, else chunks hold KC/group groups;
    0 if neither fits."""
    kc = KC[bits]
    if group is None:
        return 1
    if group % kc == 0:
        per = group // kc
        return 1 if per & (per - 1) == 0 else 0
    if kc % group == 0 and group % 16 == 0:
        return kc // group
    return 0


def chunk_shift(bits: int, group: int | None) -> int:
    """log2(chunks per group) for groups of whole chunks (31 per channel: every chunk is group 0)."""
    if group is None:
        return 31
    return max(0, (group // KC[bits]).bit_length() - 1)


@dataclass(frozen=True)
class Tile:
    """One launch shape of the small-M kernel."""

    max_m: int
    mt: int  # m16 tiles per block (1 when swapped)
    nt: int  # n8 tiles per block
    wn: int  # warps side by side over N, sharing x
    wk: int  # groups of wn warps per block, splitting K
    stages: int  # depth of each group's asynchronous-copy ring
    swap: bool  # W as the mma's A operand, x rows as B (n8 parts)
    fold: bool  # zero point and scale applied per group on the sums
    xr: int  # rows of x per block
    wgmma: bool  # the warpgroup-MMA kernel (sm_90a): W from registers, x from shared memory
    fn: Any  # the compiled kernel
    smem: int  # dynamic shared memory per block

    def __post_init__(self) -> None:  # the launch geometry, computed once rather than per call
        object.__setattr__(self, "rows", self.xr if self.swap else 16 * self.mt)
        object.__setattr__(self, "cols", 8 * self.nt * self.wn)
        object.__setattr__(self, "threads", (32 * self.wk * self.wn, 1, 1))


@dataclass(frozen=True)
class MmaLayout:
    """A weight as the tensor-core kernel reads it, with the launch shapes chosen for it at load."""

    w: torch.Tensor  # uint8 [Npad/8/TG, chunks, TG, 32, 16]
    sz: torch.Tensor  # group parameters [groups, Npad, ...]
    perm: torch.Tensor | None  # act-order: the input order that makes groups contiguous
    N: int
    K: int
    n_pad: int
    chunks: int
    shift: int  # log2(chunks per group), when a group spans whole chunks
    tiles: tuple[Tile, ...]  # ascending max_m; larger batches take the dense path
    dense_fn: Any  # the dequantizer of the dense path
    slice_chunks: int  # chunks dequantized per cuBLAS call on the dense path
    act: torch.dtype
    device: int
    bits: int
    gpc: int
    code: int = 4  # CODE template argument: 4, 8, E2M1, LUT4, Q4K or Q80
    col_scale: torch.Tensor | None = None  # fp32 [N] applied to the sums (fp4, code books), or None
    book: torch.Tensor | None = None  # LUT4: int32 [256], mma_codebook.book_pairs

    @functools.cached_property
    def pointers(self) -> tuple[int, int, int, int]:
        """The fixed kernel arguments (w, sz, column factor, code book; 0 for none), read once."""
        return (
            self.w.data_ptr(),
            self.sz.data_ptr(),
            0 if self.col_scale is None else self.col_scale.data_ptr(),
            0 if self.book is None else self.book.data_ptr(),
        )


# -- the integer kernels' own parts ---------------------------------------------------------------


def int_conditions(spec: LayerSpec, caps: Any, bits: int) -> Verdict:
    """Integer weights of ``bits`` bits whose groups the kernel's chunks can hold."""
    s = spec.scheme
    group = s.group_size if s.granularity == "group" else None
    return check(
        *wna16_conditions(spec, caps, bits, "cupy", "NVRTC compiles the kernel"),
        (
            groups_per_chunk(bits, group) > 0,
            f"group size {KC[bits]} times a power of two, or 16..{KC[bits]} dividing it",
            {"group_size": group},
        ),
    )


def int_operands(weight: CanonicalWeight, group: int | None, act: torch.dtype, bits: int) -> Operands:
    """Integer codes as stored; scales and zeros as the kernel's biased group parameters."""
    sz = group_params(weight["scales"], weight.get("zeros"), bits, weight.K, group, act).sz
    return weight["qweight"], sz, None, None


def over_base(table: dict[str, Any], key: str, base: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A key's launch rows over its base's, bucket by bucket: the key holds only the buckets swept
    for it, the base's rows serve every other bucket. So retuning the base reaches every key that
    did not sweep that bucket, and the table holds no copies. A ``dense`` row (the sweep found
    dequant + cuBLAS faster there) ends the rows: that M and every larger one run the dense path."""
    own = table.get(key) or []
    mine = {r["max_m"] for r in own}
    rows = sorted([*own, *(r for r in base if r["max_m"] not in mine)], key=lambda r: r["max_m"])
    end = next((i for i, r in enumerate(rows) if r.get("dense")), len(rows))
    return rows[:end]


def int_rows(table: dict[str, Any], bits: int) -> list[dict[str, Any]]:
    """The launch shapes per M bucket: int4's and int8's own sweeps (``small_m_w4``,
    ``small_m_w8``) over the integer rows (``small_m``)."""
    return over_base(table, f"small_m_w{bits}", table["small_m"])


# -- load: the layout and its strategies ----------------------------------------------------------


def prepare_mma(
    kernel: Kernel,
    weight: CanonicalWeight,
    spec: LayerSpec,
    *,
    bits: int,
    code: int,
    operands: OperandsFn,
    tile_rows: RowsFn,
    group: int | None = None,
) -> Prepared:
    """``prepare`` of every kernel on the tensor-core kernel: its format's operands and launch
    rows, repacked and compiled into one :class:`MmaLayout` (:func:`mma_layout`), then
    :func:`build`."""
    layout = mma_layout(
        weight, spec, bits=bits, code=code, operands=operands, tile_rows=tile_rows, group=group
    )
    return build(kernel, layout, spec)


def mma_layout(
    weight: CanonicalWeight,
    spec: LayerSpec,
    *,
    bits: int,
    code: int,
    operands: OperandsFn,
    tile_rows: RowsFn,
    group: int | None = None,
) -> MmaLayout:
    """Repack the codes, lay out the group parameters, and compile the launch shapes of the
    device's table (the wgmma ones on Hopper, for integer codes) and the dense path's dequantizer.
    ``group``: inputs per group parameter where the format's operands differ from its scheme's
    groups (GGUF q5_k: one per 32-input sub-block)."""
    s = weight.scheme
    if group is None:
        group = s.group_size if s.granularity == "group" else None
    perm = act_order_perm(weight, group or weight.K)
    q = weight["qweight"]
    dev = q.device.index if q.device.index is not None else torch.cuda.current_device()
    N, K = weight.N, weight.K
    act = spec.act_dtype
    codes, sz, col_scale, book = operands(weight, group, act)
    packed = repack_codes(codes, bits, N, K, perm, natural=code == LUT4)
    chunks = packed.shape[1]
    n_pad = packed.shape[0] * TG * 8
    gpc = groups_per_chunk(bits, group)
    cap = torch.cuda.get_device_capability(dev)
    table = tile_table.load(CUDA.package, "wna16_mma", f"sm_{cap[0]}{cap[1]}")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    limit = smem_limit(dev) - BOOK_SMEM.get(code, 0)
    szb = sz_bytes(act, code)
    rows = tile_rows(table)
    shapes = [(Shape.of(row, bits, act, gpc, foldable=folds(code, bits)), row) for row in rows]
    shapes = [
        (sh, row) for sh, row in shapes if not sh.wgmma or (cap == (9, 0) and code == bits)
    ]  # sm_90a code: Hopper only, integer codes only
    mma = [tile_expr(act, code, gpc, sh) for sh, _ in shapes if not sh.wgmma]
    compile_all(SOURCE, [*mma, dense_expr(act, code, gpc)], dev)
    wg = [tile_expr(act, code, gpc, sh) for sh, _ in shapes if sh.wgmma]
    if wg:
        compile_all(WG_SOURCE, wg, dev)
    tiles = []
    for shape, row in shapes:
        wk = pick_warps(shape, row, n_pad, chunks, sms, limit, gpc, szb, bits)
        tiles.append(make_tile(shape, act, code, gpc, dev, wk))
    dense_fn = Launch(function(SOURCE, dense_expr(act, code, gpc), dev), DENSE_ARGS)
    budget = int(table.get("dense_workspace_mb", 256)) << 20
    slice_chunks = max(1, min(chunks, budget // (2 * N * KC[bits])))
    return MmaLayout(
        w=packed, sz=sz, perm=None if perm is None else perm.to(q.device), N=N, K=K, n_pad=n_pad,
        chunks=chunks, shift=chunk_shift(bits, group), tiles=tuple(tiles), dense_fn=dense_fn,
        slice_chunks=slice_chunks, act=act, device=dev, bits=bits, gpc=gpc, code=code,
        col_scale=col_scale, book=book,
    )  # fmt: skip


def build(kernel: Kernel, layout: MmaLayout, spec: LayerSpec) -> Prepared:
    """The prepared layer over ``layout``: :func:`strategies`, fed activations in the layout's
    dtype, results in the layer's output dtype (tools rebuild one from a replaced layout)."""
    return kernel.prepared(
        layout, in_act_dtype(strategies(layout), layout.act, spec.output_dtype), spec, layout.w.device
    )


def strategies(layout: MmaLayout) -> list[Strategy]:
    """One strategy per launch shape (ascending batch bound), then dequant + cuBLAS for every
    larger batch. Their ``fn`` takes x, bias and ``out`` in the activation dtype."""
    return [*(tile_strategy(t) for t in layout.tiles), dense_strategy(layout)]


def tile_strategy(tile: Tile) -> Strategy:
    """Batches up to ``tile.max_m`` on one launch of ``tile``."""
    fn = _wgmma if tile.wgmma else _mma
    return Strategy(tile.max_m, tile_name(tile), functools.partial(fn, tile))


def dense_strategy(layout: MmaLayout) -> Strategy:
    """Every batch past the launch shapes: K slices of ``layout.slice_chunks`` chunks dequantized
    into scratch, each multiplied by cuBLAS."""
    k = layout.slice_chunks * KC[layout.bits]
    return Strategy(ALL_M, f"dequant+cuBLAS (K slices of {min(k, layout.K)})", _dense)


def tile_name(tile: Tile) -> str:
    """A launch shape as plans and benchmarks print it."""
    if tile.wgmma:
        return f"wgmma XR{tile.xr} WN{tile.wn} WK{tile.wk}"
    kind = f"swapped XR{tile.xr}" if tile.swap else f"MT{tile.mt}"
    return f"mma {kind} NT{tile.nt} WN{tile.wn} WK{tile.wk}{' folded' if tile.fold else ''}"


def sz_bytes(act: torch.dtype, code: int) -> int:
    """Bytes per group parameter: a (zb, s) pair, fp32 pairs for bf16 int8, one e5m3 byte for fp4, one
    scale in the activation dtype for code books, a 16-byte super-block head for GGUF q4_k, the fp16
    block scale for GGUF q8_0 and q4_0, d and m for q4_1, the fifth bits and two halves for q5_0,
    q5_1 and q5_k, two bit words and two scales (16 bytes) for q6_k, two scales (q3_k) or two scales and
    offsets (q2_k)."""
    if code == E2M1:
        return 1
    if code == LUT4:
        return 2
    if code in (Q4K, Q6K):
        return 16
    if code in (Q80, Q40):
        return 2
    if code in (F8E4, F8E5):
        return 4
    if code in (Q50, Q51, Q5K, Q2K):
        return 8
    if code == Q3K:
        return 4
    return 8 if (act == torch.bfloat16 and code == 8) else 4


def params_fit(nt: int, szb: int) -> bool:
    """A warp's group parameters per chunk are copied as whole 16-byte pieces by its 32 lanes
    (``PG`` in the kernel): nt * 8 columns of szb bytes must be 16..512 bytes, a power of two."""
    n = nt * 8 * szb
    return 16 <= n <= 512 and n & (n - 1) == 0


def fit_tiles(rows: list[dict[str, Any]], szb: int) -> list[dict[str, Any]]:
    """Launch rows with their n8 tiles per warp moved into what the parameter copy allows for
    szb-byte group parameters (:func:`params_fit`), and even (swapped tiles pair them)."""
    ok = [nt for nt in (2, 4, 8, 16, 32, 64) if params_fit(nt, szb)]
    return [{**r, "nt": min(ok[-1], max(ok[0], int(r["nt"])))} if "nt" in r else r for r in rows]


def smem_limit(dev: int) -> int:
    props = torch.cuda.get_device_properties(dev)
    return int(getattr(props, "shared_memory_per_block_optin", SMEM_LIMIT))


@dataclass(frozen=True)
class Shape:
    """A launch shape as the tuning table gives it, resolved for one layer's scheme."""

    max_m: int
    mt: int
    nt: int
    stages: int
    swap: bool
    fold: bool
    xr: int

    wn: int = 1
    wgmma: bool = False

    @classmethod
    def of(cls, row: dict[str, Any], bits: int, act: torch.dtype, gpc: int, foldable: bool = True) -> Shape:
        """Swapped operands by default up to M=16, on request up to 64 (x rows as n8 parts);
        ``foldable`` False (fp4, code books: no zero point to fold) keeps every shape unfolded."""
        max_m = int(row["max_m"])
        if row.get("wgmma"):  # 64 columns per warpgroup (wn = 4 per warpgroup), unfolded
            xr = int(row.get("xr", next(n for n in WG_N if n >= min(max_m, WG_N[-1]))))
            if xr not in WG_N:
                raise ValueError(f"wgmma rows per block {xr}: expected one of {WG_N}")
            wn = 4 * max(1, min(int(row.get("wgn", 1)), MAX_WN // 4))
            return cls(max_m, 1, 2, int(row.get("stages", 3)), True, False, xr, wn, True)
        mt, nt = int(row["mt"]), int(row["nt"])
        # "xr": rows per block of a swapped shape below max_m (more row blocks, which read each
        # weight tile close together in time, so mostly from the L2)
        xr_row = int(row.get("xr", 0))
        if xr_row and (xr_row % 8 or not 8 <= xr_row <= min(max_m, MAX_SWAP_M)):
            raise ValueError(
                f"swapped rows per block {xr_row}: a multiple of 8 in 8..{min(max_m, MAX_SWAP_M)}"
            )
        swap = (max_m <= MAX_SWAP_M or xr_row > 0) and nt % 2 == 0 and bool(row.get("swap", max_m <= 16))
        if swap:
            mt = 1
            xr = xr_row or (1 << (max_m - 1).bit_length() if max_m <= 8 else -(-max_m // 8) * 8)
        else:
            xr = 16 * mt
        fold = foldable and gpc == 1 and bool(row.get("fold", True))
        wn = max(1, min(int(row.get("wn", 1)), MAX_WN))
        return cls(max_m, mt, nt, int(row.get("stages", 3)), swap, fold, xr, wn)

    @property
    def rows(self) -> int:
        """Rows of x (and y) per block."""
        return self.xr if self.swap else 16 * self.mt

    @property
    def cols(self) -> int:
        """Output columns per block."""
        return 8 * self.nt * self.wn

    def smem(self, wk: int, gpc: int, szb: int, bits: int) -> int:
        """Bytes of the copy rings (x slice, and per warp codes and group parameters), or of the
        reduction if larger."""
        warp = self.nt * 512 + -(-gpc * self.nt * 8 * szb // 16) * 16
        stage = self.xr * KC[bits] * 2 + self.wn * warp
        return wk * max(self.stages * stage, self.rows * self.cols * 4)


def make_tile(shape: Shape, act: torch.dtype, code: int, gpc: int, dev: int, wk: int) -> Tile:
    fn = function(WG_SOURCE if shape.wgmma else SOURCE, tile_expr(act, code, gpc, shape), dev)
    wk = max(
        1, min(wk, fn.max_threads_per_block // (32 * shape.wn), max_groups(shape))
    )  # registers bound the block
    smem = shape.smem(wk, gpc, sz_bytes(act, code), code_bits(code))
    return Tile(
        shape.max_m,
        shape.mt,
        shape.nt,
        shape.wn,
        wk,
        shape.stages,
        shape.swap,
        shape.fold,
        shape.xr,
        shape.wgmma,
        Launch(fn, WG_ARGS if shape.wgmma else MMA_ARGS),
        smem,
    )


def pick_warps(
    shape: Shape,
    row: dict[str, Any],
    n_pad: int,
    chunks: int,
    sms: int,
    limit: int,
    gpc: int,
    szb: int,
    bits: int,
) -> int:
    """K groups per block: the tuned count if given, else enough warps on the GPU to keep loads
    in flight; at most one per chunk and what shared memory and the block size allow."""
    blocks = max(1, -(-n_pad // shape.cols))
    want = (
        int(row["wk"]) if "wk" in row else -(-int(row.get("warps_per_sm", 16)) * sms // (blocks * shape.wn))
    )
    per_group = shape.smem(1, gpc, szb, bits)
    cap = min(int(row.get("max_wk", 16)), limit // per_group, 32 // shape.wn, max_groups(shape), chunks)
    return max(1, min(want, cap))


def max_groups(shape: Shape) -> int:
    """K groups a block may hold: each group of several warps syncs on its own named barrier (1..15)."""
    return 32 if shape.wn == 1 else 15


# -- the call: x, bias and out in the activation dtype --------------------------------------------


def _operand(lay: MmaLayout, x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """x in the weight's input order, its rows on 16-byte boundaries (x travels in 16-byte pieces),
    and its row stride. A contiguous x with K % 8 == 0 has them already (a single row needs no stride)."""
    if lay.perm is not None:
        x = x.index_select(1, lay.perm)
    if x.data_ptr() % 16 or lay.K % 8 or not x.is_contiguous():
        if x.stride(1) != 1 or x.stride(0) % 8 or x.data_ptr() % 16:
            x = _aligned(x)
        return x, x.stride(0)
    return x, lay.K


def _mma(
    tile: Tile, lay: MmaLayout, x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None, ws: Any
) -> torch.Tensor:
    """``y = x @ W.T (+ bias)`` in one launch of the mma.sync kernel."""
    x, ldx = _operand(lay, x)
    M = x.shape[0]
    if out is None:
        y, ldy = torch.empty(M, lay.N, dtype=lay.act, device=lay.w.device), lay.N
    else:
        y, ldy = out, out.stride(0)
    w, sz, cs, book = lay.pointers
    tile.fn(
        (-(-M // tile.rows), -(-lay.n_pad // tile.cols), 1),
        tile.threads,
        (
            x.data_ptr(), w, sz, 0 if bias is None else bias.data_ptr(), cs, book, y.data_ptr(),
            M, lay.K, ldx, ldy, lay.N, lay.n_pad, lay.chunks, lay.shift,
        ),
        tile.smem,
        stream(lay.device),
    )  # fmt: skip
    return y


def _wgmma(
    tile: Tile, lay: MmaLayout, x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None, ws: Any
) -> torch.Tensor:
    """``y = x @ W.T (+ bias)`` in one launch of the warpgroup-MMA kernel (integer codes, Hopper)."""
    x, _ = _operand(lay, x)
    M = x.shape[0]
    y = torch.empty(M, lay.N, dtype=lay.act, device=x.device) if out is None else out
    xw = wgmma_x_order(x[:, : lay.K], lay.bits, lay.chunks)  # _aligned's columns past K are garbage
    tile.fn(
        (-(-M // tile.xr), -(-lay.n_pad // (8 * tile.nt * tile.wn)), 1),
        (32 * tile.wk * tile.wn, 1, 1),
        (
            xw.data_ptr(),
            lay.w.data_ptr(),
            lay.sz.data_ptr(),
            0 if bias is None else bias.data_ptr(),
            y.data_ptr(),
            M,
            xw.stride(0),
            y.stride(0),
            lay.N,
            lay.n_pad,
            lay.chunks,
            lay.shift,
        ),
        tile.smem,
        stream(lay.device),
    )
    return y


def _aligned(x: torch.Tensor) -> torch.Tensor:
    """x with rows starting on 16-byte boundaries (a row stride that is a multiple of 8)."""
    K = x.shape[1]
    buf = torch.empty(x.shape[0], -(-K // 8) * 8, dtype=x.dtype, device=x.device)
    buf[:, :K] = x
    return buf


def _dense(
    lay: MmaLayout, x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None, ws: Any
) -> torch.Tensor:
    """Large M: dequantize K slices into scratch and let cuBLAS multiply each (a per-column
    factor, when the layer has one, scales the sums before the bias is added)."""
    if lay.perm is not None:
        x = x.index_select(1, lay.perm)
    kc = KC[lay.bits]
    width = lay.slice_chunks * kc
    scratch = torch.empty(lay.N, width, dtype=lay.act, device=x.device)
    y = out
    cs, after = lay.col_scale, None
    if cs is not None:
        bias, after = None, bias
    for c0 in range(0, lay.chunks, lay.slice_chunks):
        cnt = min(lay.slice_chunks, lay.chunks - c0)
        k0, k1 = c0 * kc, min(lay.K, (c0 + cnt) * kc)
        items = -(-lay.N // 8) * cnt
        lay.dense_fn(
            (-(-items // 8), 1, 1),
            (256, 1, 1),
            (
                lay.w.data_ptr(),
                lay.sz.data_ptr(),
                0 if lay.book is None else lay.book.data_ptr(),
                scratch.data_ptr(),
                lay.N,
                lay.K,
                lay.n_pad,
                lay.chunks,
                c0,
                cnt,
                width,
                lay.shift,
            ),
            0,
            stream(lay.device),
        )
        w = scratch[:, : k1 - k0]
        xs = x[:, k0:k1]
        if y is None:
            y = torch.nn.functional.linear(xs, w, bias)
        elif c0 == 0:
            if bias is None:
                torch.mm(xs, w.t(), out=y)
            else:
                torch.addmm(bias, xs, w.t(), out=y)
        else:
            y.addmm_(xs, w.t())
    if cs is not None:
        y.mul_(cs)
        if after is not None:
            y.add_(after)
    return y


def tile_expr(act: torch.dtype, code: int, gpc: int, shape: Shape) -> str:
    """The kernel instance for one launch shape (``code``: an integer width or a format's CODE; wgmma is
    integer-only)."""
    if shape.wgmma:
        return f"wna16_wgmma<{CT[act]}, {code}, {shape.xr}, {shape.wn // 4}, {gpc}, {shape.stages}>"
    b = {True: "true", False: "false"}
    return (
        f"wna16_mma<{CT[act]}, {code}, {shape.mt}, {shape.nt}, {shape.wn}, {gpc}, {shape.stages}, {shape.xr}, "
        f"{b[shape.swap]}, {b[shape.fold]}>"
    )


def dense_expr(act: torch.dtype, code: int, gpc: int) -> str:
    return f"wna16_dequant<{CT[act]}, {code}, {gpc}>"


class CudaMmaInt(Kernel):
    """The integer weight-only family on tensor cores (weights repacked so each lane loads its
    fragments whole); a kernel of it declares only its name and ``bits``. Not registered itself."""

    bits: ClassVar[int] = 0

    @classmethod
    def can_implement(cls, spec: LayerSpec, caps: Any) -> Verdict:
        return int_conditions(spec, caps, cls.bits)

    @classmethod
    def operands(cls, weight: CanonicalWeight, group: int | None, act: torch.dtype) -> Operands:
        return int_operands(weight, group, act, cls.bits)

    @classmethod
    def tile_rows(cls, table: dict[str, Any]) -> list[dict[str, Any]]:
        return int_rows(table, cls.bits)

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> Prepared:
        return prepare_mma(
            self,
            weight,
            spec,
            bits=self.bits,
            code=self.bits,
            operands=self.operands,
            tile_rows=self.tile_rows,
        )


class CudaMmaW4A16(CudaMmaInt):
    name = "cuda.mma_w4a16"
    bits = 4
    description = "CUDA int4 weight-only on tensor cores (mma.sync, lane-order repack); cuBLAS on dequantized slices for large M"


class CudaMmaW8A16(CudaMmaInt):
    name = "cuda.mma_w8a16"
    bits = 8
    description = "CUDA int8 weight-only on tensor cores (mma.sync, lane-order repack); cuBLAS on dequantized slices for large M"
