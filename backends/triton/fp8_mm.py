"""FP8 W8A8 matmul in Triton, portable across GPU vendors: rowwise scales and DeepSeek-V3 block scales.

Both kernels read the weight in quantrt's canonical layout, fp8 [N, K] with K contiguous, and feed
``tl.dot`` fp8 operands with an fp32 accumulator (fp8 wgmma on Hopper, MFMA on CDNA3). Triton wants
the B operand as [K, N], so a weight tile is loaded transposed by pointer arithmetic; nothing is
copied. All pointers and strides are passed explicitly, nothing syncs with the host and nothing is
autotuned at run time, so a call can be captured in a CUDA graph with the tile the caller picked.

* rowwise: ``y = (xq . w) * a_scale[m] * w_scale[n] (+ bias[n])``. The scales commute with the sum,
  so they are applied once in the epilogue. torch's ``_scaled_mm`` (cuBLASLt) serves the same op,
  but streams only ~61% of copy bandwidth at M = 1 on the H200: small M is this kernel's job.
* block: weight scales per (bn, bk) block and activation scales per token and group of bk channels
  do not commute with the K sum, so every K-tile's partial dot is scaled before it is accumulated
  (which also promotes the tensor cores' fp8 accumulation to fp32 every tile). torch's
  ``_scaled_mm`` rejects block scales; this kernel is the portable block GEMM.

Split-K (``split_k`` > 1, for small M where N/BN tiles cannot fill the GPU): program ``pid_k`` takes
every ``split_k``-th K-tile and scales its partial sum; the tile's last program to finish sums the
partials in order, adds the bias and stores the output dtype (``common.reduce_tile``): one launch,
deterministic. With ``split_k == 1`` the epilogue applies scales and bias and stores directly.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import (
    TileConfig,
    TileCounters,
    check_block,
    check_config,
    check_epilogue,
    empty_result,
    load_k_tiles,
    reduce_tile,
    split_k_buffers,
)
from .launch import Call, Launcher, cdiv

#: fp8 flavours the kernels read: OCP (NVIDIA Ada/Hopper/Blackwell, AMD gfx950) and fnuz (AMD gfx942)
OCP_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
FNUZ_FP8 = (torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)
#: programs that share a band of M-tiles run together so the band's activations stay in L2
GROUP_M = 8


@triton.jit
def _tile_ids(M, N, BM: tl.constexpr, BN: tl.constexpr, GM: tl.constexpr):
    """Grouped tile order: GM M-tiles sweep N together, so each weight tile is reused from L2."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    per_group = GM * num_n
    first_m = (pid // per_group) * GM
    rows = tl.minimum(num_m - first_m, GM)
    pid_m = first_m + (pid % per_group) % rows
    pid_n = (pid % per_group) // rows
    return pid_m, pid_n


@triton.jit
def _fp8_rowwise_kernel(
    X, W, AS, WS, B, Y, P, C,
    M, N, K,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_am, stride_wsn, stride_b, stride_ym, stride_yn,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT_K: tl.constexpr, GM: tl.constexpr,
    EVEN_K: tl.constexpr, HAS_B: tl.constexpr,
):  # fmt: skip
    pid_m, pid_n = _tile_ids(M, N, BM, BN, GM)
    pid_k = tl.program_id(1)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_k = tl.arange(0, BK)
    mask_m = offs_m < M
    mask_n = offs_n < N
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for t in range(pid_k, tl.cdiv(K, BK), SPLIT_K):
        kk = t * BK + offs_k
        a, b = load_k_tiles(
            X, W, kk, offs_m, offs_n, mask_m, mask_n, K, stride_xm, stride_xk, stride_wn, stride_wk, EVEN_K
        )  # b: the w tile transposed, [BK, BN]
        # Hopper's fp8 MMA adds in reduced precision; Triton's default there keeps it over all of K
        # (cuBLASLt's use_fast_accum). Promote into the fp32 accumulator once per K tile instead,
        # which keeps long K as accurate as the reference (DeepSeek-V3 promotes every 128).
        acc = tl.dot(a, b, acc, max_num_imprecise_acc=BK)
    a_s = tl.load(AS + offs_m * stride_am, mask=mask_m, other=0.0)
    w_s = tl.load(WS + offs_n * stride_wsn, mask=mask_n, other=0.0)
    acc = acc * a_s[:, None] * w_s[None, :]
    reduce_tile(acc, B, Y, P, C, tl.program_id(0), pid_k, offs_m, offs_n, mask_m, mask_n, M, N,
                stride_b, stride_ym, stride_yn, HAS_B, SPLIT_K)  # fmt: skip


_fp8_rowwise_launch = Launcher(_fp8_rowwise_kernel)


@triton.jit
def _fp8_block_kernel(
    X, XS, W, WS, B, Y, P, C,
    M, N, K,
    stride_xm, stride_xk, stride_xsm, stride_xsk, stride_wn, stride_wk, stride_wsn, stride_wsk, stride_b,
    stride_ym, stride_yn,
    QN: tl.constexpr, QK: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT_K: tl.constexpr, GM: tl.constexpr,
    EVEN_K: tl.constexpr, HAS_B: tl.constexpr,
):  # fmt: skip
    pid_m, pid_n = _tile_ids(M, N, BM, BN, GM)
    pid_k = tl.program_id(1)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_k = tl.arange(0, BK)
    mask_m = offs_m < M
    mask_n = offs_n < N
    nb = (pid_n * BN) // QN  # BN divides QN: the whole n-tile lies in one weight-scale row
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for t in range(pid_k, tl.cdiv(K, BK), SPLIT_K):
        kk = t * BK + offs_k
        a, b = load_k_tiles(
            X, W, kk, offs_m, offs_n, mask_m, mask_n, K, stride_xm, stride_xk, stride_wn, stride_wk, EVEN_K
        )  # b: the w tile transposed, [BK, BN]
        kb = t // (QK // BK)  # BK divides QK: the whole k-tile lies in one scale column
        x_s = tl.load(XS + offs_m * stride_xsm + kb * stride_xsk, mask=mask_m, other=0.0)
        w_s = tl.load(WS + nb * stride_wsn + kb * stride_wsk)
        acc += tl.dot(a, b) * (x_s * w_s)[:, None]
    reduce_tile(acc, B, Y, P, C, tl.program_id(0), pid_k, offs_m, offs_n, mask_m, mask_n, M, N,
                stride_b, stride_ym, stride_yn, HAS_B, SPLIT_K)  # fmt: skip


_fp8_block_launch = Launcher(_fp8_block_kernel)


def _check_operands(
    xq: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    out: torch.Tensor | None,
    config: TileConfig,
    what: str,
) -> tuple[int, int, int]:
    if xq.dim() != 2 or w.dim() != 2:
        raise ValueError(
            f"{what}: xq must be [M, K] and w [N, K], found shapes {list(xq.shape)} and {list(w.shape)}"
        )
    fp8 = OCP_FP8 + FNUZ_FP8
    if xq.dtype not in fp8 or w.dtype not in fp8:
        raise ValueError(
            f"{what}: xq and w must be fp8 ({', '.join(map(str, fp8))}), found {xq.dtype} and {w.dtype}"
        )
    if (xq.dtype in FNUZ_FP8) != (w.dtype in FNUZ_FP8):
        raise ValueError(
            f"{what}: xq and w must both be OCP fp8 or both fnuz fp8 (one hardware flavour), "
            f"found {xq.dtype} and {w.dtype}"
        )
    M, K = xq.shape
    N = w.shape[0]
    if w.shape[1] != K:
        raise ValueError(f"{what}: w must be [N, K] with K = {K} (xq's K), found {list(w.shape)}")
    if w.device != xq.device:
        raise ValueError(f"{what}: w must be on xq's device {xq.device}, found {w.device}")
    # tl.dot needs M, N >= 16 and, for 8-bit operands on NVIDIA, K >= 32
    check_config(config, 32, what)
    check_epilogue(bias, out, out_dtype, M, N, xq.device, what, name=str)
    return M, N, K


def _check_scale(
    s: torch.Tensor, name: str, shapes: tuple[tuple[int, ...], ...], dev: torch.device, what: str
) -> None:
    if s.dtype != torch.float32:
        raise ValueError(f"{what}: {name} must be float32, found {s.dtype}")
    if tuple(s.shape) not in shapes:
        raise ValueError(
            f"{what}: {name} must have shape {' or '.join(map(str, map(list, shapes)))}, "
            f"found {list(s.shape)}"
        )
    if s.device != dev:
        raise ValueError(f"{what}: {name} must be on xq's device {dev}, found {s.device}")


def _grid(M: int, N: int, config: TileConfig) -> tuple[int, int]:
    """Program ids (tile in :func:`_tile_ids` order, K-split)."""
    return (cdiv(M, config.block_m) * cdiv(N, config.block_n), config.split_k)


def fp8_rowwise_matmul(
    xq: torch.Tensor,
    a_scale: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    config: TileConfig,
    out: torch.Tensor | None = None,
    counters: TileCounters | None = None,
) -> torch.Tensor:
    """``y[m, n] = sum_k xq[m, k] * w[n, k] * a_scale[m] * w_scale[n] (+ bias[n])``, fp32 accumulation.

    xq: fp8 [M, K]; a_scale: fp32 [M, 1] or [M] (per token) or one element (per tensor); w: fp8
    [N, K] as checkpoints store it; w_scale: fp32 [N] or [N, 1] (per channel; per-tensor weights pass
    it expanded); bias: [N] float16/bfloat16/float32 or None. The result is ``out_dtype`` [M, N] (fp16,
    bf16 or fp32), written into ``out`` when given. Scales are applied once, in the epilogue: they do
    not depend on k. On Hopper the tensor cores' reduced-precision fp8 sums are promoted into the
    fp32 accumulator once per K tile, so long K stays as accurate as the reference. ``counters``:
    the layer's split-K arrival counters (:class:`.common.TileCounters`); None makes zeros per call.
    """
    what = "fp8_rowwise_matmul"
    M, N, _ = _check_operands(xq, w, bias, out_dtype, out, config, what)
    dev = xq.device
    if a_scale.numel() == 1 and a_scale.dim() <= 2:
        stride_am = 0  # per tensor: every row reads the one scale
        _check_scale(a_scale, "a_scale", (tuple(a_scale.shape),), dev, what)
    else:
        _check_scale(a_scale, "a_scale", ((M, 1), (M,)), dev, what)
        stride_am = a_scale.stride(0)
    _check_scale(w_scale, "w_scale", ((N,), (N, 1)), dev, what)
    if M == 0:
        return empty_result(N, out_dtype, out, dev)
    y = torch.empty(M, N, device=dev, dtype=out_dtype) if out is None else out
    part, cnt = split_k_buffers(y, _grid(M, N, config)[0], M, N, config, counters)
    rowwise_call(xq, a_scale, w, w_scale, bias, y, part, cnt, config, stride_am)()
    return y


def rowwise_call(
    xq: torch.Tensor,
    a_scale: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
    y: torch.Tensor,
    part: torch.Tensor,
    cnt: torch.Tensor,
    config: TileConfig,
    stride_am: int,
) -> Call:
    """The launch of :func:`fp8_rowwise_matmul` into given buffers, unchecked (M >= 1): ``part``
    and ``cnt`` from :func:`.common.split_k_buffers`; ``stride_am`` 0 for one activation scale.
    Its first eight arguments are the pointers."""
    M, K = xq.shape
    N = w.shape[0]
    return Call(_fp8_rowwise_launch, _grid(M, N, config), (
        xq, w, a_scale, w_scale, bias if bias is not None else w_scale, y, part, cnt,
        M, N, K,
        xq.stride(0), xq.stride(1), w.stride(0), w.stride(1), stride_am, w_scale.stride(0),
        bias.stride(0) if bias is not None else 0, y.stride(0), y.stride(1),
    ), dict(
        BM=config.block_m, BN=config.block_n, BK=config.block_k, SPLIT_K=config.split_k, GM=GROUP_M,
        EVEN_K=K % config.block_k == 0, HAS_B=bias is not None,
        num_warps=config.num_warps, num_stages=config.num_stages,
    ))  # fmt: skip


def fp8_block_matmul(
    xq: torch.Tensor,
    x_scale: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    block: tuple[int, int],
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    config: TileConfig,
    out: torch.Tensor | None = None,
    counters: TileCounters | None = None,
) -> torch.Tensor:
    """Block fp8 (DeepSeek-V3): ``y = sum_kb (xq_kb . w_kb) * x_scale[m, kb] * w_scale[nb, kb] (+ bias)``.

    block = (bn, bk); w: fp8 [N, K] with w_scale fp32 [ceil(N/bn), ceil(K/bk)]; xq: fp8 [M, K] with
    per-token-group scales x_scale fp32 [M, ceil(K/bk)] (groups of bk along K, any strides, e.g.
    column-major). Ragged last blocks of N and K keep their own scales. ``config.block_k`` must divide
    bk and ``config.block_n`` must divide bn, so every tile needs one weight scale per K-tile (and one
    activation scale per row); each K-tile's partial dot is scaled, then accumulated in fp32.
    ``counters``: as :func:`fp8_rowwise_matmul`'s.
    """
    what = "fp8_block_matmul"
    M, N, K = _check_operands(xq, w, bias, out_dtype, out, config, what)
    bn, bk = check_block(block, what)
    if bk % config.block_k or bn % config.block_n:
        raise ValueError(
            f"{what}: config.block_k={config.block_k} must divide bk={bk} and "
            f"config.block_n={config.block_n} must divide bn={bn} (one weight scale per tile and K-tile)"
        )
    dev = xq.device
    nkb = cdiv(K, bk)
    _check_scale(w_scale, "w_scale", ((cdiv(N, bn), nkb),), dev, what)
    _check_scale(x_scale, "x_scale", ((M, nkb),), dev, what)
    if M == 0:
        return empty_result(N, out_dtype, out, dev)
    y = torch.empty(M, N, device=dev, dtype=out_dtype) if out is None else out
    part, cnt = split_k_buffers(y, _grid(M, N, config)[0], M, N, config, counters)
    block_call(xq, x_scale, w, w_scale, (bn, bk), bias, y, part, cnt, config)()
    return y


def block_call(
    xq: torch.Tensor,
    x_scale: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    block: tuple[int, int],
    bias: torch.Tensor | None,
    y: torch.Tensor,
    part: torch.Tensor,
    cnt: torch.Tensor,
    config: TileConfig,
) -> Call:
    """The launch of :func:`fp8_block_matmul` into given buffers, unchecked (M >= 1), as
    :func:`rowwise_call`'s. Its first eight arguments are the pointers."""
    M, K = xq.shape
    N = w.shape[0]
    return Call(_fp8_block_launch, _grid(M, N, config), (
        xq, x_scale, w, w_scale, bias if bias is not None else w_scale, y, part, cnt,
        M, N, K,
        xq.stride(0), xq.stride(1), x_scale.stride(0), x_scale.stride(1), w.stride(0), w.stride(1),
        w_scale.stride(0), w_scale.stride(1), bias.stride(0) if bias is not None else 0,
        y.stride(0), y.stride(1),
    ), dict(
        QN=block[0], QK=block[1],
        BM=config.block_m, BN=config.block_n, BK=config.block_k, SPLIT_K=config.split_k, GM=GROUP_M,
        EVEN_K=K % config.block_k == 0, HAS_B=bias is not None,
        num_warps=config.num_warps, num_stages=config.num_stages,
    ))  # fmt: skip
