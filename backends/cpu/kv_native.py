"""The KV cache on x86 CPUs: native quantize-on-write and decode attention (``native/csrc/kv.cpp``).

Why it exists: the torch path (:class:`quantrt.kv.kernels.TorchKV`) dequantizes a chunk of the
context into fp32 tensors and runs two einsums per chunk, which on the CPU is slower than bf16
attention over a contiguous cache; decode is a stream over the pages, and the native kernel reads
each key and value row once for the G query heads that share it, dequantizing it in registers, with
the softmax online in fp32 (flash decoding over context splits when there are few sequence x head
items for the threads). Writes store the same bytes as the torch codec (tests compare them).

Schemes: the unquantized cache (fp32, bf16, fp16 pages), :class:`~quantrt.schemes.KVCacheScheme`
fp8 e4m3 / e5m2 and int8 with tensor, head, token or group scales, and every
:class:`~quantrt.schemes.TurboQuantScheme`. TurboQuant writes keep the key norm and rotation in torch
(the reference's fp32 GEMM, whose sum order nothing else reproduces bit for bit; the norm correction's
norm too) and code, pack and scatter natively; decode rotates the query once per call and scores the
packed codes against the centroids without ever decoding a key (as the Triton kernels do). Registered
for ``cpu`` devices with ``registry.register_kv("cpu", NativeKV())``.
"""

from __future__ import annotations

import ctypes
import functools
from typing import TYPE_CHECKING

import torch

from quantrt.kernels import Verdict
from quantrt.kv import kv_qmax
from quantrt.kv.kernels import KVKernels
from quantrt.kv.pages import KVCacheError
from quantrt.reference.turboquant import check_head_dim, codebook, rotation
from quantrt.schemes import KVCacheScheme, KVScheme, TurboQuantScheme

from .dense_native import cpu_features
from .native import build
from .native_common import DTYPE_CODE, check_rc

if TYPE_CHECKING:
    from quantrt.kv.pages import KVPages

#: instructions kv.cpp is compiled for (its decode; the write is scalar C)
FEATURES = ("avx512f", "avx512bw", "avx512vl", "f16c")
#: code types of kv.cpp's planes (0-2: the unquantized cache's dtype codes)
CODE = {"int8": 3, "fp8_e4m3": 4, "fp8_e5m2": 5}
#: kv.cpp's code types of TurboQuant's packed 4- and 3-bit codes
PACKED = {4: 6, 3: 7}
#: scale granularities of kv.cpp
GRAN = {None: 0, "tensor": 1, "head": 2, "token": 3, "group": 4}
#: fewest tokens a context split holds (a split costs a partial result and a merge)
MIN_SPLIT = 256
#: work items per thread below which decode splits the context
ITEMS_PER_THREAD = 4
#: TurboQuant's fp16 norms and value scales saturate here (the reference's _fp16)
FP16_MAX = 65504.0
#: the static scale of TurboQuant's fp8 (k8) keys, which are stored unscaled
_ONE = torch.ones(1, dtype=torch.float32)


@functools.cache
def _library() -> ctypes.CDLL:
    lib = build.library("kv")
    i64, i32, ptr, f32 = ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p, ctypes.c_float
    lib.quantrt_kv_isa.restype = i32
    lib.quantrt_kv_write.restype = i32
    lib.quantrt_kv_write.argtypes = [
        ptr, i32, i64, i64, i64, i64, i64, ptr, ptr, i32, i32, i64, ptr, ptr, f32, i32,
    ]  # fmt: skip
    lib.quantrt_kv_tq_keys.restype = i32
    lib.quantrt_kv_tq_keys.argtypes = [ptr, i64, i64, i64, ptr, ptr, i32, ptr, i32, ptr, ptr, i32]
    lib.quantrt_kv_tq_values.restype = i32
    lib.quantrt_kv_tq_values.argtypes = [ptr, i32, i64, i64, i64, i64, i64, ptr, ptr, ptr, ptr, i32, i32]
    lib.quantrt_kv_decode.restype = i32
    lib.quantrt_kv_decode.argtypes = [
        ptr, i32, i64, i64, i64, i64, i64,  # q
        ptr, ptr, i32, i32, ptr, ptr, i32, i64,  # planes, code types, scales
        ptr, ptr, ptr, ptr, ptr,  # TurboQuant: key norms, value scales and zeros, tables
        i64, i64, i64, ptr, i64, ptr, i64,  # heads, block size, slots, block table, lengths, max_len
        i64, f32, f32, ptr, ptr, i64,  # window, scale, softcap, sinks, mask
        ptr, i32, i64, i64, i64, i32,  # out, splits, threads
    ]  # fmt: skip
    if not lib.quantrt_kv_isa():
        raise RuntimeError("native KV kernels: the library was built without AVX-512 F/BW/VL")
    return lib


def _ptr(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


def _source(x: torch.Tensor, name: str) -> torch.Tensor:
    """Keys or values as kv.cpp reads them: on the CPU, fp32 / bf16 / fp16, unit stride in D."""
    if not x.is_cpu:
        raise KVCacheError(f"KV write: {name} is on {x.device}, the cache on the CPU")
    if x.dtype not in DTYPE_CODE:
        x = x.float()
    return x if x.stride(-1) == 1 else x.contiguous()


def code_types(pages: KVPages) -> tuple[int, int]:
    """kv.cpp's codes of the pages' key and value elements."""
    s = pages.scheme
    if isinstance(s, TurboQuantScheme):
        return CODE["fp8_e4m3"] if s.key_bits == 8 else PACKED[s.key_bits], PACKED[s.value_bits]
    ct = DTYPE_CODE[pages.dtype] if s is None else CODE[s.dtype]
    return ct, ct


@functools.cache
def tq_tables(head_dim: int, key_bits: int, value_bits: int) -> dict[str, torch.Tensor]:
    """TurboQuant's constants as kv.cpp reads them: the key code book's boundaries and centroids, and
    the 16-entry tables of packed keys (centroids) and values (the codes' integers); a 3-bit table
    holds its 8 entries twice, since the kernel indexes by a code's low 4 bits."""
    out = {"vtab": torch.arange(16, dtype=torch.float32) % 2**value_bits}
    if key_bits != 8:
        centroids, bounds = codebook(head_dim, key_bits)
        out |= {"centroids": centroids, "bounds": bounds, "ktab": centroids.repeat(16 >> key_bits)}
    return {n: t.contiguous() for n, t in out.items()}


def splits_for(B: int, H: int, length: int, threads: int) -> int:
    """Context splits per (sequence, KV head): enough items to keep every thread busy at small
    B * H, each split at least ``MIN_SPLIT`` tokens."""
    items = B * H
    want = ITEMS_PER_THREAD * threads
    if items >= want or length < 2 * MIN_SPLIT:
        return 1
    return max(1, min(-(-want // items), length // MIN_SPLIT))


class NativeKV(KVKernels):
    """Quantize-on-write and split-context decode attention in C++ with AVX-512 (CPU caches)."""

    name = "native"

    def supports(
        self, scheme: KVScheme | None, head_dim: int, dtype: torch.dtype, device: torch.device
    ) -> Verdict:
        if device.type != "cpu":
            return Verdict.no("a CPU cache", device=device.type)
        if scheme is not None and not isinstance(scheme, KVCacheScheme | TurboQuantScheme):
            return Verdict.no("an unquantized, fp8, int8 or TurboQuant cache", scheme=str(scheme))
        why = check_head_dim(scheme, head_dim) if isinstance(scheme, TurboQuantScheme) else None
        if why:
            return Verdict.no("a head_dim TurboQuant's planes can hold", note=why, head_dim=head_dim)
        if dtype not in DTYPE_CODE:
            return Verdict.no("a float32, bfloat16 or float16 cache", dtype=dtype)
        ok, why = build.status()
        if not ok:
            return Verdict.no("native CPU kernels can be built", build=why)
        missing = [f for f in FEATURES if f not in cpu_features()]
        if missing:
            return Verdict.no("CPU features " + " ".join(FEATURES), missing=" ".join(missing))
        return Verdict.yes("native C++ (AVX-512): quantize on write, split-context decode over the pages")

    def write(self, pages: KVPages, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        N, H, D = k.shape
        slots = slots.to(device="cpu", dtype=torch.long).reshape(-1).contiguous()
        if slots.numel() != N:
            raise KVCacheError(f"KV write: {N} keys and values but {slots.numel()} slots")
        if N == 0:
            return
        nslots = pages.num_blocks * pages.block_size
        top = int(slots.max())
        if top >= nslots:
            raise KVCacheError(f"KV write: slot {top} is past the cache's {nslots} slots")
        s = pages.scheme
        if isinstance(s, TurboQuantScheme):
            self._write_turboquant(pages, s, k, v, slots)
            return
        gran = GRAN[s.granularity if s is not None else None]  # type: ignore[union-attr]
        qmax = kv_qmax(s) if s is not None else 0.0  # type: ignore[arg-type]
        flat = pages.flat()
        ng = flat["k_scale"].shape[-1] if "k_scale" in flat else 1
        lib, ct, nt = _library(), code_types(pages)[0], torch.get_num_threads()
        for name, x, static in (("k", k, pages.k_scale), ("v", v, pages.v_scale)):
            if pages.static and static is None:
                raise KVCacheError(f"{s}: a static scale is needed to write {name} (calibrate or load one)")
            x = _source(x, name)
            rc = lib.quantrt_kv_write(
                x.data_ptr(), DTYPE_CODE[x.dtype], N, H, D, x.stride(0), x.stride(1), slots.data_ptr(),
                flat[name].data_ptr(), ct, gran, ng, _ptr(static), _ptr(flat.get(f"{name}_scale")),
                qmax, nt,
            )  # fmt: skip
            check_rc(rc, f"native KV write of {name}")

    def _write_turboquant(
        self, pages: KVPages, s: TurboQuantScheme, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor
    ) -> None:
        """TurboQuant planes byte-equal to the torch codec's. The kept rows are taken first, as
        ``TorchKV.write`` does, so the key norm and rotation below are the reference's own torch ops on
        the same tensor (one fp32 GEMM, whose rounding only the same call reproduces); kv.cpp codes,
        packs and scatters. With norm correction the centroids' norm is torch's too (kv.cpp hands the
        chosen centroids back): its fp32 sum order is torch's vectorised reduction."""
        for name, x in (("k", k), ("v", v)):
            if not x.is_cpu:
                raise KVCacheError(f"KV write: {name} is on {x.device}, the cache on the CPU")
        keep = slots >= 0
        if not bool(keep.all()):
            k, v, slots = k[keep], v[keep], slots[keep]
        N, H, D = k.shape
        if N == 0:
            return
        flat, lib, nt = pages.flat(), _library(), torch.get_num_threads()
        if s.key_bits == 8:  # e4m3 keys, unscaled and saturating: the fp8 write with a scale of 1
            x = _source(k, "k")
            rc = lib.quantrt_kv_write(
                x.data_ptr(), DTYPE_CODE[x.dtype], N, H, D, x.stride(0), x.stride(1), slots.data_ptr(),
                flat["k"].data_ptr(), CODE["fp8_e4m3"], GRAN["tensor"], 1, _ONE.data_ptr(), 0,
                float(torch.finfo(torch.float8_e4m3fn).max), nt,
            )  # fmt: skip
            check_rc(rc, "native KV write of k")
        else:
            tabs = tq_tables(D, s.key_bits, s.value_bits)
            xf = k.to(torch.float32)
            norm = torch.linalg.vector_norm(xf, dim=-1)
            tiny = torch.finfo(torch.float32).tiny
            unit = torch.where(norm[..., None] > 0, xf / norm.clamp_min(tiny)[..., None], 0.0)
            y = (unit @ rotation(D)).contiguous()
            chosen = torch.empty_like(y) if s.norm_correction else None
            rc = lib.quantrt_kv_tq_keys(
                y.data_ptr(), N, H, D, slots.data_ptr(), flat["k"].data_ptr(), s.key_bits,
                tabs["bounds"].data_ptr(), tabs["bounds"].numel(), tabs["centroids"].data_ptr(), _ptr(chosen), nt,
            )  # fmt: skip
            check_rc(rc, "native KV write of k")
            if chosen is not None:
                norm = norm / torch.linalg.vector_norm(chosen, dim=-1)
            flat["k_norm"].index_copy_(0, slots, norm.clamp(-FP16_MAX, FP16_MAX).to(torch.float16))
        x = _source(v, "v")
        rc = lib.quantrt_kv_tq_values(
            x.data_ptr(), DTYPE_CODE[x.dtype], N, H, D, x.stride(0), x.stride(1), slots.data_ptr(),
            flat["v"].data_ptr(), flat["v_scale"].data_ptr(), flat["v_zero"].data_ptr(), s.value_bits, nt,
        )  # fmt: skip
        check_rc(rc, "native KV write of v")

    def decode(
        self,
        q: torch.Tensor,
        pages: KVPages,
        block_table: torch.Tensor,
        seq_lens: torch.Tensor,
        max_len: int,
        *,
        scale: float,
        window: int | None = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        B, Hq, D = q.shape
        H, bs = pages.num_kv_heads, pages.block_size
        if D != pages.head_dim or Hq % H:
            raise KVCacheError(
                f"KV decode: q {list(q.shape)} does not fit a cache of {H} KV heads of {pages.head_dim}"
            )
        if not q.is_cpu:
            raise KVCacheError(f"KV decode: q is on {q.device}, the cache on the CPU")
        lens = seq_lens.to(device="cpu", dtype=torch.int32).reshape(-1).contiguous()
        if lens.numel() != B:
            raise KVCacheError(f"KV decode: seq_lens {list(seq_lens.shape)} for {B} sequences")
        bt = block_table.to(device="cpu", dtype=torch.int32)
        if bt.dim() != 2 or bt.shape[0] != B:
            raise KVCacheError(f"KV decode: block_table {list(block_table.shape)} for {B} sequences")
        if bt.stride(1) != 1:
            bt = bt.contiguous()
        longest = min(max_len, int(lens.max())) if B else 0
        if -(-longest // bs) > bt.shape[1]:
            raise KVCacheError(
                f"KV decode: block_table {list(bt.shape)} holds {bt.shape[1] * bs} tokens per sequence, "
                f"{longest} are read"
            )
        if mask is not None:
            mask = mask.to(device="cpu", dtype=torch.bool)
            if mask.dim() != 2 or mask.shape[0] != B or mask.shape[1] < longest:
                raise KVCacheError(
                    f"KV decode: mask {list(mask.shape)} must be [{B}, >= {longest}] (one row per sequence)"
                )
            if mask.stride(1) != 1:
                mask = mask.contiguous()
        if sinks is not None:
            sinks = sinks.to(device="cpu", dtype=torch.float32).reshape(-1).contiguous()
            if sinks.numel() != Hq:
                raise KVCacheError(f"KV decode: sinks {sinks.numel()} values for {Hq} query heads")
        if B == 0:
            return torch.empty((B, Hq, D), dtype=q.dtype)
        x = q if q.dtype in DTYPE_CODE else q.float()
        flat = pages.flat()
        s = pages.scheme
        kn = vsc = vzr = ktab = vtab = None
        if isinstance(s, TurboQuantScheme):
            gran, ks, vs, ng = GRAN[None], None, None, 1
            tabs = tq_tables(D, s.key_bits, s.value_bits)
            vsc, vzr, vtab = flat["v_scale"], flat["v_zero"], tabs["vtab"]
            if s.key_bits != 8:  # scored against the centroids: the query rotated once, in fp32
                kn, ktab = flat["k_norm"], tabs["ktab"]
                x = q.float() @ rotation(D)
        elif s is not None and s.dynamic:
            gran = GRAN[s.granularity]
            ks, vs = flat["k_scale"], flat["v_scale"]
            ng = ks.shape[-1]
        else:
            gran = GRAN[s.granularity if s is not None else None]
            ks, vs, ng = pages.k_scale, pages.v_scale, 1
            if pages.static and (ks is None or vs is None):
                raise KVCacheError(f"{s}: the cache has no static scales yet (nothing was written)")
        if x.stride(-1) != 1:
            x = x.contiguous()
        out = torch.empty((B, Hq, D), dtype=x.dtype)
        nt = torch.get_num_threads()
        kct, vct = code_types(pages)
        rc = _library().quantrt_kv_decode(
            x.data_ptr(), DTYPE_CODE[x.dtype], B, Hq, D, x.stride(0), x.stride(1),
            flat["k"].data_ptr(), flat["v"].data_ptr(), kct, vct, _ptr(ks), _ptr(vs), gran, ng,
            _ptr(kn), _ptr(vsc), _ptr(vzr), _ptr(ktab), _ptr(vtab),
            H, bs, pages.num_blocks * bs, bt.data_ptr(), bt.stride(0), lens.data_ptr(), max_len,
            int(window or 0), float(scale), float(softcap or 0.0), _ptr(sinks),
            _ptr(mask), 0 if mask is None else mask.stride(0),
            out.data_ptr(), DTYPE_CODE[out.dtype], out.stride(0), out.stride(1),
            splits_for(B, H, longest, nt), nt,
        )  # fmt: skip
        check_rc(rc, "native KV decode")
        return out if out.dtype == q.dtype else out.to(q.dtype)
