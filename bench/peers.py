"""Peer kernels as benchmark baselines: vLLM's Marlin int4 GEMM (gptq_marlin, bf16 x uint4b8 x g128),
vLLM's Machete (Hopper CUTLASS mixed-input GEMM, same types), bitsandbytes' NF4 matmul and
gemlite's Triton int4 GEMM/GEMV.

Peer code is never committed: ``ci/build-peers.sh`` builds ``libmarlin_peer.so`` and
``ci/build-peers-machete.sh`` builds ``libmachete_peer.so`` from a vLLM (and CUTLASS) source into
the git-ignored ``.peers/`` (or ``$QUANTRT_PEERS_DIR``), and this module drives them through
ctypes with raw device pointers, so no torch extension has to be built on the GPU machine. What
is ours here: the canonical -> GPTQ word layout, the Marlin scale order, the buffer sizes, and the
calls, each following what vLLM's Python does before its own op.

bitsandbytes and gemlite are Python packages that travel as wheels (``.peers/wheels``, never in
the requirements); each is imported only when its baseline is asked for. What is ours: the
canonical -> bnb ``QuantState`` mapping (bnb's 4-bit layout *is* the canonical bnb4 layout) and
the canonical int codes/scales/zeros handed to gemlite's documented ``GemLiteLinear.pack``.

``marlin_baseline``, ``machete_baseline``, ``bnb_nf4_baseline`` and ``gemlite_baseline`` each take
a canonical weight and return ``x -> y`` or None; ``last_reason`` then says why.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

LIB_NAME = "libmarlin_peer.so"
ABI_VERSION = 1
GROUP = 128
# vLLM sizes Marlin's lock workspace as SMs x MARLIN_MAX_BLOCKS_PER_SM int32 zeros; the kernel
# needs at least one lock per SM and leaves them zero after each call, so one buffer serves all.
LOCKS_PER_SM = 4
# fp32 reduce buffer: SMs x min(ceil16(M), 64) x max_thread_n (256) floats, as marlin_gemm sizes it.
C_TMP_MAX_M = 64
MAX_THREAD_N = 256
# vLLM's defaults: fp32 global reduce on, atomic-add reduce off (VLLM_MARLIN_USE_ATOMIC_ADD unset).
USE_FP32_REDUCE = True
USE_ATOMIC_ADD = False

last_reason = ""  # why the last *_baseline call returned None


def peers_dir() -> Path:
    """Where build-peers.sh puts its outputs: ``$QUANTRT_PEERS_DIR`` or ``.peers`` at the repo root."""
    env = os.environ.get("QUANTRT_PEERS_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[1] / ".peers"


def _open_library(name: str, prefix: str, abi: int, build: str) -> tuple[ctypes.CDLL | None, str]:
    """A peer library from :func:`peers_dir` whose ``<prefix>_abi_version()`` is ``abi``, its
    ``<prefix>_last_error`` typed, or None and why (missing: run ``build``; unloadable; other ABI)."""
    path = peers_dir() / name
    if not path.is_file():
        return None, f"{path} is missing: run {build}"
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        return None, f"{path} does not load: {e}"
    version = getattr(lib, f"{prefix}_abi_version")
    version.restype = ctypes.c_int
    if version() != abi:
        return None, f"{path} has ABI {version()}, expected {abi}: rebuild it"
    getattr(lib, f"{prefix}_last_error").restype = ctypes.c_char_p
    return lib, ""


def _usable(reason: str | None, load: Callable[[], tuple[ctypes.CDLL | None, str]]) -> ctypes.CDLL | None:
    """The library ``load`` gives where the weight suits it (``reason`` None), else None with
    ``last_reason`` saying why (the weight's reason first, then the library's)."""
    global last_reason
    lib, why = load()
    if reason is not None or lib is None:
        last_reason = reason or why
        return None
    last_reason = ""
    return lib


def _bf16_rows(x: torch.Tensor, K: int, N: int, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """x as the [M, K] bf16 rows a CUTLASS-style peer reads (unit stride along K, rows 16-byte
    aligned, copied where not) and its [M, N] bf16 output."""
    if x.dtype != torch.bfloat16 or x.shape[-1] != K or x.device != dev:
        raise ValueError(f"expected bf16 [..., {K}] on {dev}, found {x.dtype} {list(x.shape)} on {x.device}")
    a = x.reshape(-1, K)
    if a.stride(1) != 1 or a.stride(0) % 8 or a.data_ptr() % 16:
        a = a.contiguous()
    return a, torch.empty(a.shape[0], N, dtype=torch.bfloat16, device=dev)


@functools.cache
def load_library() -> tuple[ctypes.CDLL | None, str]:
    """The Marlin peer library with typed entry points, or None and why (missing, unloadable, other ABI)."""
    lib, why = _open_library(LIB_NAME, "marlin_peer", ABI_VERSION, "ci/build-peers.sh VLLM_SRC")
    if lib is None:
        return None, why
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.marlin_peer_repack_u4.argtypes = [p, p, i64, i64, p]
    lib.marlin_peer_repack_u4.restype = i32
    lib.marlin_peer_gemm_bf16_u4b8.argtypes = [p, p, p, p, p, p, i64, i64, i64, i64, i64, i32, i32, p]
    lib.marlin_peer_gemm_bf16_u4b8.restype = i32
    return lib, ""


def unsupported_reason(canon: Any) -> str | None:
    """Why Marlin as built cannot take this weight: only what the library instantiates (int4
    symmetric, groups of 128 along K, 16-bit activations, no act-order) and its tile rules."""
    s = canon.scheme
    if (s.weight, s.bits, s.symmetric, s.granularity, s.group_size) != ("int", 4, True, "group", GROUP):
        return f"{s} is not int4 symmetric with groups of {GROUP}"
    if s.act is not None or s.act_order:
        return f"{s}: Marlin here takes bf16 activations and no act-order"
    if canon.K % GROUP or canon.K <= GROUP:
        return f"K={canon.K}: needs a multiple of {GROUP} above {GROUP} (only grouped kernels are built)"
    if canon.N % 64:
        return f"N={canon.N}: Marlin tiles need N divisible by 64"
    if canon.device.type != "cuda":
        return f"the weight is on {canon.device}, Marlin runs on CUDA"
    return None


def gptq_qweight(canon: Any) -> torch.Tensor:
    """Canonical uint8 [N, K/2] (low nibble = even k) -> GPTQ int32 [K/8, N] (nibble i of word r
    = row 8r+i). Both are one LSB-first stream along K, so a little-endian int32 view of each row's
    bytes already holds GPTQ's words; only the transpose moves data."""
    q = canon["qweight"]
    if q.dtype != torch.uint8 or tuple(q.shape) != (canon.N, canon.K // 2):
        raise ValueError(
            f"qweight must be uint8 [{canon.N}, {canon.K // 2}], found {q.dtype} {list(q.shape)}"
        )
    return q.contiguous().view(torch.int32).t().contiguous()


def marlin_scale_order(scales: torch.Tensor, K: int) -> torch.Tensor:
    """Scales [K/G, N] in the column order Marlin's kernel reads them (vLLM's marlin_permute_scales).

    Grouped scales: each run of 64 columns is read as an 8 x 8 block transposed, column 8i+j taking
    column i+8j. One group over all of K: each run of 32 takes columns 2i + {0,1,8,9,16,17,24,25}.
    """
    groups, N = scales.shape
    if groups > 1:
        out = scales.reshape(-1, 8, 8).transpose(1, 2)
    else:
        pairs = torch.arange(4, device=scales.device)[:, None] * 2
        cols = (pairs + torch.tensor([0, 1, 8, 9, 16, 17, 24, 25], device=scales.device)).flatten()
        out = scales.reshape(-1, 32)[:, cols]
    return out.reshape(groups, N).contiguous()


def _check(lib: ctypes.CDLL, rc: int, what: str, prefix: str = "marlin_peer") -> None:
    """Raise with the library's own message where a call returned non-zero."""
    if rc:
        msg = getattr(lib, f"{prefix}_last_error")().decode(errors="replace")
        raise RuntimeError(f"{prefix.replace('_', ' ')} {what}: {msg}")


def marlin_baseline(canon: Any) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """vLLM's Marlin on this weight: repacked once here, then ``x -> y`` (bf16 [..., K] -> [..., N]).

    None when the library is missing or the scheme is not what it was built for (``last_reason``).
    Scales go to bf16 as vLLM keeps them for bf16 activations; quantrt's int scales are
    fp16-exact, so this rounds each by at most 2^-8 relative.
    """
    lib = _usable(unsupported_reason(canon), load_library)
    if lib is None:
        return None
    K, N = canon.K, canon.N
    dev = canon.device
    with torch.cuda.device(dev):
        stream = torch.cuda.current_stream(dev).cuda_stream
        words = gptq_qweight(canon)
        packed = torch.empty(K // 16, 2 * N, dtype=torch.int32, device=dev)
        _check(lib, lib.marlin_peer_repack_u4(words.data_ptr(), packed.data_ptr(), K, N, stream), "repack")
        scales = marlin_scale_order(canon["scales"].t().to(torch.bfloat16), K)
        sms = torch.cuda.get_device_properties(dev).multi_processor_count
        locks = torch.zeros(sms * LOCKS_PER_SM, dtype=torch.int32, device=dev)
        c_tmp = torch.empty(sms * C_TMP_MAX_M * MAX_THREAD_N, dtype=torch.float32, device=dev)
        torch.cuda.current_stream(dev).synchronize()  # once, so `words` is not freed under the repack

    def run(x: torch.Tensor) -> torch.Tensor:
        a, y = _bf16_rows(x, K, N, dev)
        M = a.shape[0]
        if M:
            rc = lib.marlin_peer_gemm_bf16_u4b8(
                a.data_ptr(),
                packed.data_ptr(),
                scales.data_ptr(),
                y.data_ptr(),
                c_tmp.data_ptr(),
                locks.data_ptr(),
                M,
                N,
                K,
                a.stride(0),
                GROUP,
                int(USE_ATOMIC_ADD),
                int(USE_FP32_REDUCE),
                torch.cuda.current_stream(dev).cuda_stream,
            )
            _check(lib, rc, "gemm")
        return y.reshape(*x.shape[:-1], N)

    return run


# vLLM's Machete -----------------------------------------------------------------------------------

MACHETE_LIB_NAME = "libmachete_peer.so"
MACHETE_ABI_VERSION = 1
# Machete's prepacked blocks are 128 (N) x 64 (K): PPBlockShape_NK, vLLM's check_machete_supports_shape.
MACHETE_BLOCK_N = 128
MACHETE_BLOCK_K = 64


@functools.cache
def load_machete_library() -> tuple[ctypes.CDLL | None, str]:
    """The Machete peer library with typed entry points, or None and why (missing, unloadable, other ABI)."""
    build = "ci/build-peers-machete.sh VLLM_SRC CUTLASS_SRC"
    lib, why = _open_library(MACHETE_LIB_NAME, "machete_peer", MACHETE_ABI_VERSION, build)
    if lib is None:
        return None, why
    p, i64, i32, s = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_char_p
    lib.machete_peer_schedules.restype = s
    lib.machete_peer_heuristic.argtypes = [i64, i64, i64]
    lib.machete_peer_heuristic.restype = s
    lib.machete_peer_prepack_B_u4b8.argtypes = [p, p, i64, i64, p]
    lib.machete_peer_prepack_B_u4b8.restype = i32
    size = ctypes.POINTER(ctypes.c_size_t)
    lib.machete_peer_workspace_bf16_u4b8.argtypes = [p, p, p, p, i64, i64, i64, i64, i64, s, size]
    lib.machete_peer_workspace_bf16_u4b8.restype = i32
    lib.machete_peer_gemm_bf16_u4b8.argtypes = [p, p, p, p, p, ctypes.c_size_t, i64, i64, i64, i64, i64, s, p]
    lib.machete_peer_gemm_bf16_u4b8.restype = i32
    return lib, ""


def machete_unsupported_reason(canon: Any) -> str | None:
    """Why Machete as built cannot take this weight: int4 symmetric (uint4b8) with groups of 128
    along K, bf16 activations, no act-order (what the library instantiates), its prepacked block
    (K % 64, N % 128), and a Hopper GPU (sm_90a code only)."""
    s = canon.scheme
    if (s.weight, s.bits, s.symmetric, s.granularity, s.group_size) != ("int", 4, True, "group", GROUP):
        return f"{s} is not int4 symmetric with groups of {GROUP}"
    if s.act is not None or s.act_order:
        return f"{s}: Machete here takes bf16 activations and no act-order"
    if canon.K % GROUP or canon.K % MACHETE_BLOCK_K:
        return f"K={canon.K}: Machete needs K divisible by {MACHETE_BLOCK_K} and the group ({GROUP})"
    if canon.N % MACHETE_BLOCK_N:
        return f"N={canon.N}: Machete's prepacked blocks need N divisible by {MACHETE_BLOCK_N}"
    if canon.device.type != "cuda":
        return f"the weight is on {canon.device}, Machete runs on CUDA"
    cap = torch.cuda.get_device_capability(canon.device)
    if cap != (9, 0):
        return f"Machete is built for sm_90a (Hopper) only; this GPU is sm_{cap[0]}{cap[1]}"
    return None


def machete_schedule(M: int, N: int, K: int) -> str | None:
    """The schedule vLLM's heuristic picks for this problem (None without the library)."""
    lib, _ = load_machete_library()
    return None if lib is None else lib.machete_peer_heuristic(M, N, K).decode()


def machete_baseline(
    canon: Any, schedule: str | None = None
) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """vLLM's Machete on this weight: prepacked once here, then ``x -> y`` (bf16 [..., K] -> [..., N]).

    What vLLM's ``MacheteLinearKernel`` does: ``machete_prepack_B`` on the GPTQ words [K/8, N]
    held column-major (``w.t().contiguous().t()``), whose memory is exactly the canonical
    ``qweight`` bytes [N, K/2] read as int32 [N, K/8] (one LSB-first code stream per row), so no
    copy; scales bf16 [K/G, N] row-major (for bf16 activations vLLM keeps them in bf16; quantrt's
    int scales are fp16-exact, so this rounds each by at most 2^-8 relative, as for Marlin); then
    ``machete_mm(a, b_q, uint4b8, b_group_scales=s, b_group_size=128)`` per call. ``schedule``:
    one of vLLM's schedule names, else vLLM's heuristic picks per M (a pick not built into the
    library raises when called). The stream-K workspace vLLM allocates per call is sized once per
    M here and kept.

    None when the library is missing or the scheme/GPU is not what it was built for (``last_reason``).
    """
    lib = _usable(machete_unsupported_reason(canon), load_machete_library)
    if lib is None:
        return None
    K, N = canon.K, canon.N
    dev = canon.device
    sched = schedule.encode() if schedule else None
    with torch.cuda.device(dev):
        stream = torch.cuda.current_stream(dev).cuda_stream
        q = canon["qweight"]
        if q.dtype != torch.uint8 or tuple(q.shape) != (N, K // 2):
            raise ValueError(f"qweight must be uint8 [{N}, {K // 2}], found {q.dtype} {list(q.shape)}")
        words = q.contiguous().view(torch.int32)  # [N, K/8]: vLLM's B [K/8, N], strides (1, K/8)
        packed = torch.empty(K // 8, N, dtype=torch.int32, device=dev)
        rc = lib.machete_peer_prepack_B_u4b8(words.data_ptr(), packed.data_ptr(), K, N, stream)
        _check(lib, rc, "prepack", "machete_peer")
        scales = canon["scales"].t().to(torch.bfloat16).contiguous()  # [K/G, N]
        torch.cuda.current_stream(dev).synchronize()  # once, so `words` outlives the prepack
    workspace_bytes: dict[int, int] = {}
    workspace = [torch.empty(0, dtype=torch.uint8, device=dev)]

    def run(x: torch.Tensor) -> torch.Tensor:
        a, y = _bf16_rows(x, K, N, dev)
        M = a.shape[0]
        if M:
            args = (a.data_ptr(), packed.data_ptr(), scales.data_ptr(), y.data_ptr())
            need = workspace_bytes.get(M)
            if need is None:
                n = ctypes.c_size_t(0)
                rc = lib.machete_peer_workspace_bf16_u4b8(
                    *args, M, N, K, a.stride(0), GROUP, sched, ctypes.byref(n)
                )
                _check(lib, rc, "workspace", "machete_peer")
                need = workspace_bytes[M] = n.value
            if workspace[0].numel() < need:
                workspace[0] = torch.empty(need, dtype=torch.uint8, device=dev)
            rc = lib.machete_peer_gemm_bf16_u4b8(
                *args,
                workspace[0].data_ptr(),
                workspace[0].numel(),
                M,
                N,
                K,
                a.stride(0),
                GROUP,
                sched,
                torch.cuda.current_stream(dev).cuda_stream,
            )
            _check(lib, rc, "gemm", "machete_peer")
        return y.reshape(*x.shape[:-1], N)

    return run


def _import_peer(name: str) -> tuple[Any | None, str]:
    """A peer package, or None and why: not installed (the wheels did not travel) or its import
    failed (a package that probes the GPU at import fails there without one)."""
    try:
        return importlib.import_module(name), ""
    except ImportError as e:
        return None, f"{name} is not installed ({e}): install .peers/wheels/*.whl"
    except Exception as e:  # import-time probes raise anything; the row records it, the rest run
        return None, f"import {name} failed: {type(e).__name__}: {str(e)[:160]}"


# bitsandbytes NF4 ------------------------------------------------------------------------------


def bnb_unsupported_reason(canon: Any) -> str | None:
    """Why bitsandbytes' NF4 matmul cannot take this weight as it is: NF4 only, bnb's own code book
    (its CUDA kernels decode with a built-in table, not the stored one), and one quant state per
    weight (a fused layer's per-slice double-quant offsets have no single bnb offset)."""
    from quantrt.reference.bnb import NF4_CODE

    s = canon.scheme
    if s.family != "bnb4" or s.weight != "nf4":
        return f"{s} is not bitsandbytes NF4"
    if not torch.equal(canon["code"].detach().cpu(), NF4_CODE):
        return f"{s}: the stored code book is not bitsandbytes' NF4 table"
    if s.double_quant and len(canon.output_sizes) > 1:
        return f"{s}: {len(canon.output_sizes)} slices with their own offsets; bnb keeps one per weight"
    return None


def bnb_quant_state(canon: Any, dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, Any]:
    """The packed weight and ``bitsandbytes.functional.QuantState`` that ``Linear4bit`` would hold
    for this canonical NF4 weight, sharing its tensors (no copy).

    The canonical bnb4 layout is bnb's own (``quantrt.formats.bnb`` reads checkpoints by a reshape):
    ``qweight`` is the row-major [N, K] weight flattened, two codes a byte, high nibble first, which
    ``Params4bit`` stores as uint8 [ceil(N*K/2), 1]; ``absmax`` is one fp32 per block of G flat
    elements; under double quant ``absmax`` is bnb's uint8 codes, ``nested_absmax`` /
    ``nested_code`` its ``state2`` (blocks of 256) and ``offset`` its scalar offset. ``dtype`` is
    the compute dtype (``bnb_4bit_compute_dtype``).
    """
    from quantrt.canonical import NESTED_BLOCK

    F = importlib.import_module("bitsandbytes.functional")
    s = canon.scheme
    kw: dict[str, Any] = {}
    if s.double_quant:
        kw["offset"] = canon["offset"].reshape(-1)[0]
        kw["state2"] = F.QuantState(
            absmax=canon["nested_absmax"],
            code=canon["nested_code"],
            blocksize=NESTED_BLOCK,
            dtype=torch.float32,
        )
    state = F.QuantState(
        absmax=canon["absmax"],
        shape=torch.Size([canon.N, canon.K]),
        code=canon["code"],
        blocksize=s.group_size,
        quant_type="nf4",
        dtype=dtype,
        **kw,
    )
    return canon["qweight"].reshape(-1, 1), state


def bnb_nf4_baseline(canon: Any) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """bitsandbytes' NF4 linear on this very weight: ``bnb.matmul_4bit(x, W, quant_state=state)``,
    the call ``bnb.nn.Linear4bit.forward`` makes (bf16 compute, no bias, inference: bnb's fused
    4-bit GEMV/GEMM up to its M threshold, dequantize + cuBLAS above it).

    None when the package is missing, it loaded no CUDA library, the weight is not on CUDA, or the
    scheme is not NF4 (``last_reason``).
    """
    global last_reason
    reason = bnb_unsupported_reason(canon)
    if reason is None and canon.device.type != "cuda":
        reason = f"the weight is on {canon.device}, the bnb baseline runs on CUDA"
    bnb = None
    if reason is None:
        bnb, why = _import_peer("bitsandbytes")
        reason = why or None
    if bnb is not None:
        # bnb imports without its native library and only fails when a kernel is called
        lib = bnb.cextension.lib
        if getattr(lib, "compiled_with_cuda", None) is not True:
            why = getattr(lib, "error_msg", "") or type(lib).__name__
            reason = f"bitsandbytes {bnb.__version__} loaded no CUDA library: {str(why)[:200]}"
    if reason is not None or bnb is None:
        last_reason = reason or "bitsandbytes unavailable"
        return None
    last_reason = ""
    weight, state = bnb_quant_state(canon, torch.bfloat16)
    K, dev = canon.K, canon.device

    def run(x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.bfloat16 or x.shape[-1] != K or x.device != dev:
            raise ValueError(
                f"expected bf16 [..., {K}] on {dev}, found {x.dtype} {list(x.shape)} on {x.device}"
            )
        return bnb.matmul_4bit(x, weight, quant_state=state)

    return run


# gemlite ---------------------------------------------------------------------------------------

GEMLITE_BITS = (1, 2, 4, 8)  # GemLiteLinearTriton.SUPPORTED_BITS_TRITON below 16


def gemlite_unsupported_reason(canon: Any) -> str | None:
    """Why gemlite's grouped integer path cannot take this weight: unsigned codes of 1/2/4/8 bits
    with groups along K (its constructor wants K % 32 == 0, K % G == 0, G >= 16), bf16
    activations, no act-order; K == G would turn the groups into gemlite's channel-wise mode."""
    s = canon.scheme
    if s.weight != "int" or s.bits not in GEMLITE_BITS or s.granularity != "group":
        return f"{s} is not grouped integer weights of {'/'.join(map(str, GEMLITE_BITS))} bits"
    if s.act is not None or s.act_order:
        return f"{s}: gemlite here takes bf16 activations and no act-order"
    G = s.group_size
    if G < 16 or canon.K % G or canon.K % 32 or canon.K <= G:
        return f"K={canon.K}, G={G}: gemlite needs G >= 16, K a multiple of 32 and of G, K > G"
    return None


def gemlite_pack_args(canon: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | int]:
    """``(W_q, scales, zeros)`` for ``GemLiteLinear.pack``, which follows HQQ: W = (W_q - zeros) * scales.

    W_q: the canonical codes unpacked to uint8 [N, K] (gemlite packs them itself, 32 / bits
    consecutive k per int32, LSB first: the GPTQ word layout). scales: [N, K/G] in bf16, the
    activations' dtype (quantrt's int scales are fp16-exact, so this rounds each by at most 2^-8
    relative, as for Marlin). zeros: asymmetric, the canonical integer zeros as bf16 [N, K/G]
    (exact: at most 2^bits); pack's default fma mode stores them as bf16(-zeros * scales).
    Symmetric, the integer 2^(bits-1): gemlite's "symmetric with shift" mode, (W_q - z) * s with
    one scalar zero and no zero tensor to load.
    """
    from quantrt.canonical import int_codes

    s = canon.scheme
    codes = int_codes(canon).to(torch.uint8)
    scales = canon["scales"].to(torch.bfloat16)
    zeros: torch.Tensor | int = 1 << (s.bits - 1) if s.symmetric else canon["zeros"].to(torch.bfloat16)
    return codes, scales, zeros


def gemlite_layer(canon: Any) -> Any:
    """A packed ``gemlite.GemLiteLinear`` (bf16 in and out) holding this weight, on its device."""
    gemlite = importlib.import_module("gemlite")
    W_q, scales, zeros = gemlite_pack_args(canon)
    layer = gemlite.GemLiteLinear(
        canon.scheme.bits,
        group_size=canon.scheme.group_size,
        in_features=canon.K,
        out_features=canon.N,
        input_dtype=gemlite.DType.BF16,
        output_dtype=gemlite.DType.BF16,
        scaled_activations=False,
    )
    layer.pack(W_q, scales, zeros, None)
    return layer


def gemlite_baseline(canon: Any) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """gemlite's Triton kernels on this weight through its documented layer: ``GemLiteLinear(...)``,
    ``.pack(W_q, scales, zeros, bias=None)``, then ``layer(x)``, which picks GEMV / split-K / GEMM
    by M and autotunes a new shape on its first call (gemlite ships tuned configs for the H100).

    None when the package is missing or fails to import, the weight is not on CUDA, or the scheme
    is not grouped integer weights it takes (``last_reason``).
    """
    global last_reason
    reason = gemlite_unsupported_reason(canon)
    if reason is None and canon.device.type != "cuda":
        reason = f"the weight is on {canon.device}, gemlite runs on CUDA"
    if reason is None:
        _, why = _import_peer("gemlite")
        reason = why or None
    if reason is not None:
        last_reason = reason
        return None
    last_reason = ""
    with torch.cuda.device(canon.device):
        layer = gemlite_layer(canon)
    K, dev = canon.K, canon.device

    def run(x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.bfloat16 or x.shape[-1] != K or x.device != dev:
            raise ValueError(
                f"expected bf16 [..., {K}] on {dev}, found {x.dtype} {list(x.shape)} on {x.device}"
            )
        return layer(x)

    return run
