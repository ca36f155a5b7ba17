"""The native CPU KV kernels (backends/cpu/kv_native.py, native/csrc/kv.cpp): every write stores the
same bytes as the torch codec (codes and scales, every scheme and granularity, every TurboQuant preset
and a few other bit widths, fresh random inputs, awkward shapes, negative slots, scattered blocks,
codebook boundary ties and special values); decode equals the torch path and the fp32 oracle over the
dequantized cache with GQA, ragged lengths, paged tables, window, softcap, sinks and masks, in fp32
(~1e-6) and 16-bit caches (one rounding of the output); context splits; registration and dispatch.
Relative errors are printed with ``-s``."""

from __future__ import annotations

import os
import zlib

import pytest
import torch

from quantrt.backends.cpu import kv_native
from quantrt.backends.cpu.kv_native import NativeKV
from quantrt.kv import KVPages, attention_reference
from quantrt.kv.kernels import TorchKV, decode_attention, torch_decode_attention
from quantrt.kv.pages import decode, gather
from quantrt.reference import turboquant as tq
from quantrt.schemes import KVCacheScheme, TurboQuantScheme, parse_kv_scheme

VERDICT = NativeKV().supports(None, 128, torch.bfloat16, torch.device("cpu"))
pytestmark = pytest.mark.skipif(not VERDICT.ok, reason=f"native KV kernels unavailable: {VERDICT.reason}")

STORES = ("fp8_e4m3", "fp8_e5m2", "int8")
#: every granularity of the torch codec, group sizes on and off the 16-element chunks
GRANS = (("tensor", 0), ("head", 0), ("token", 0), ("group", 8), ("group", 16), ("group", 32))
SCHEMES = [None, *(KVCacheScheme(d, g, gs) for d in STORES for g, gs in GRANS)]
#: fp32 cache and query: both paths sum in fp32, in different orders
FP32_TOL = 2e-5
#: every TurboQuant preset, then bit widths no preset has (no norm correction, 3-bit values under 4-
#: and 8-bit keys, 4-bit keys over 3-bit values)
TQ_PRESETS = ("kv-tq-k8v4", "kv-tq-4bit-nc", "kv-tq-k3v4-nc", "kv-tq-3bit-nc")
TQ_SCHEMES = [
    *(parse_kv_scheme(n) for n in TQ_PRESETS),
    TurboQuantScheme(4, 4),
    TurboQuantScheme(8, 3),
    TurboQuantScheme(4, 3, True),
]


def _id(s: KVCacheScheme | None) -> str:
    return "none" if s is None else str(s)


def _pages(scheme, nb: int, bs: int, H: int, D: int, dtype: torch.dtype, kernels, **kw) -> KVPages:
    p = KVPages(scheme, nb, bs, H, D, dtype=dtype, **kw)
    p.kernels = kernels
    return p


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t


def _rows(N: int, H: int, D: int, g: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    """Keys or values with per-row magnitudes over 6 decades, an all-zero row and an outlier."""
    mag = torch.logspace(-3, 3, N * H)[torch.randperm(N * H, generator=g)]
    x = torch.randn(N, H, D, generator=g) * mag.view(N, H, 1)
    x[0, 0] = 0.0
    x.view(-1)[torch.randint(0, x.numel(), (1,), generator=g)] = 5e3
    return x.to(dtype)


WRITE_SHAPES = [(1, 1, 64), (7, 3, 80), (40, 8, 128), (5, 2, 256)]


@pytest.mark.parametrize("scheme", SCHEMES, ids=_id)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_write_bytes_equal_torch_codec(scheme, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(zlib.crc32(f"{_id(scheme)} {dtype}".encode()))
    for N, H, D in WRITE_SHAPES:
        if scheme is not None and scheme.granularity == "group" and D % scheme.group_size:
            continue
        bs = 16
        nb = -(-N // bs) * 2 + 1
        kw = {}
        if scheme is not None and not scheme.dynamic and N > 1:  # given scales, some below amax (saturating)
            n = 1 if scheme.granularity == "tensor" else H
            kw = {
                "k_scale": torch.rand(n, generator=g) * 0.02 + 1e-3,
                "v_scale": torch.rand(n, generator=g) * 5,
            }
        a = _pages(scheme, nb, bs, H, D, dtype, TorchKV(), **kw)
        b = _pages(scheme, nb, bs, H, D, dtype, NativeKV(), **kw)
        for step in range(
            2
        ):  # the first write calibrates a static scheme without scales, the second reuses them
            k, v = _rows(N, H, D, g, dtype), _rows(N, H, D, g, dtype)
            slots = torch.randperm(nb * bs, generator=g)[:N]
            drop = torch.rand(N, generator=g) < 0.25
            drop[0] = False  # a static scheme calibrates on the kept tokens: keep one
            slots[drop] = -1  # skipped
            if N > 1:
                slots[1] = -1
            a.write(k, v, slots)
            b.write(k, v, slots)
            if a.static:
                assert torch.equal(a.k_scale, b.k_scale) and torch.equal(a.v_scale, b.v_scale)
            for name, plane in a.planes.items():
                assert torch.equal(_bytes(plane), _bytes(b.planes[name])), (
                    _id(scheme),
                    dtype,
                    N,
                    H,
                    D,
                    step,
                    name,
                )


#: (N, H, D): one token, one to four heads, every power-of-two head_dim a model uses, and a write
#: large enough for kv.cpp to split its rows over threads
TQ_WRITE_SHAPES = [(1, 1, 64), (1, 4, 128), (7, 3, 256), (40, 2, 128), (5, 1, 64), (3, 4, 16), (300, 4, 128)]


def _equal_planes(a: KVPages, b: KVPages, *why) -> None:
    """Every plane compared as bytes (a NaN scale equals itself)."""
    for name, plane in a.planes.items():
        assert torch.equal(plane.view(torch.uint8), b.planes[name].view(torch.uint8)), (*why, name)


@pytest.mark.parametrize("scheme", TQ_SCHEMES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_write_turboquant_bytes_equal_torch_codec(scheme: TurboQuantScheme, dtype: torch.dtype) -> None:
    """Every plane (packed codes, norms, value scales and zeros) byte for byte, two writes into the
    same pages (the second overwriting some slots), a quarter of the slots negative."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{scheme} {dtype}".encode()))
    for N, H, D in TQ_WRITE_SHAPES:
        bs = 8
        nb = -(-N // bs) * 2 + 1
        a = _pages(scheme, nb, bs, H, D, torch.bfloat16, TorchKV())
        b = _pages(scheme, nb, bs, H, D, torch.bfloat16, NativeKV())
        for step in range(2):
            k, v = _rows(N, H, D, g, dtype), _rows(N, H, D, g, dtype)
            if dtype == torch.float16:
                k, v = k.clamp(-6e4, 6e4), v.clamp(-6e4, 6e4)
            slots = torch.randperm(nb * bs, generator=g)[:N]
            slots[torch.rand(N, generator=g) < 0.25] = -1
            if N > 1:
                slots[1] = -1
            a.write(k, v, slots)
            b.write(k, v, slots)
            _equal_planes(a, b, str(scheme), dtype, N, H, D, step)


@pytest.mark.parametrize("bits", [3, 4])
def test_turboquant_key_codes_tie_rules(bits: int) -> None:
    """kv.cpp's coder on rotated values placed on every boundary, one ulp either side, +-0, +-inf and
    NaN: the codes torch.searchsorted(bounds, y, right=True) gives (a tie goes to the upper cell, NaN
    to the last), packed as pack_bits, and the chosen centroids handed back."""
    D = 64
    tabs = kv_native.tq_tables(D, bits, 4)
    bounds = tabs["bounds"]
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-38, -1e-38])
    vals = torch.cat([bounds, bounds.nextafter(bounds + 1), bounds.nextafter(bounds - 1), special])
    g = torch.Generator().manual_seed(bits)
    N, H = 5, 3
    y = vals[torch.randint(0, vals.numel(), (N, H, D), generator=g)].contiguous()
    slots = torch.tensor([4, -1, 0, 7, 2])
    codes = torch.zeros(8, H, D * bits // 8, dtype=torch.uint8)
    chosen = torch.empty_like(y)
    rc = kv_native._library().quantrt_kv_tq_keys(
        y.data_ptr(), N, H, D, slots.data_ptr(), codes.data_ptr(), bits, bounds.data_ptr(), bounds.numel(),
        tabs["centroids"].data_ptr(), chosen.data_ptr(), 1,
    )  # fmt: skip
    assert rc == 0
    idx = torch.searchsorted(bounds, y, right=True)
    keep = slots >= 0
    assert torch.equal(codes[slots[keep]], tq.pack_bits(idx, bits)[keep])
    assert torch.equal(chosen[keep], tabs["centroids"][idx][keep])
    assert not codes[[1, 3, 5, 6]].any()  # slots nobody wrote


def test_write_turboquant_special_values() -> None:
    """Rows the value codec treats specially give the reference's bytes: constant rows (scale 0),
    codes exactly half-way between levels, scales past fp16 (saturating), infinities and NaN."""
    D, H = 64, 1
    ramp = torch.arange(D, dtype=torch.float32)
    rows = torch.stack([
        torch.full((D,), 3.25), torch.zeros(D), ramp % 16 * 0.5 + 0.25, ramp * 1e30 - 1e31,
        torch.where(ramp == 5, float("inf"), ramp), torch.where(ramp == 9, -float("inf"), ramp),
        torch.where(ramp == 2, float("nan"), ramp), (ramp % 7 - 3) * 2.0**-20, ramp * 1e6,
    ])  # fmt: skip
    x = rows[:, None].expand(-1, H, -1).contiguous()
    for name in TQ_PRESETS:
        s = parse_kv_scheme(name)
        a = _pages(s, 2, 8, H, D, torch.float32, TorchKV())
        b = _pages(s, 2, 8, H, D, torch.float32, NativeKV())
        slots = torch.arange(x.shape[0])
        a.write(x, x, slots)
        b.write(x, x, slots)
        _equal_planes(a, b, name)


def test_write_unquantized_converts_once() -> None:
    """16-bit and fp32 caches fed keys of another dtype round once, as ``Tensor.to``."""
    g = torch.Generator().manual_seed(7)
    for cache in (torch.bfloat16, torch.float16, torch.float32):
        for src in (torch.float32, torch.bfloat16, torch.float16):
            a = _pages(None, 4, 8, 3, 80, cache, TorchKV())
            b = _pages(None, 4, 8, 3, 80, cache, NativeKV())
            k = (torch.randn(9, 3, 80, generator=g) * 100).to(src)
            v = torch.randn(9, 3, 80, generator=g).to(src)
            slots = torch.tensor([3, -1, 0, 31, 7, -5, 12, 30, 1])
            a.write(k, v, slots)
            b.write(k, v, slots)
            for name in a.planes:
                assert torch.equal(a.planes[name], b.planes[name]), (cache, src, name)


def test_write_strided_input_and_bad_slots() -> None:
    g = torch.Generator().manual_seed(8)
    s = parse_kv_scheme("kv-int8-token")
    a = _pages(s, 4, 8, 2, 64, torch.float32, TorchKV())
    b = _pages(s, 4, 8, 2, 64, torch.float32, NativeKV())
    big = torch.randn(5, 4, 64, generator=g)
    k, v = big[:, ::2], big[:, 1::2]  # head stride 128
    slots = torch.tensor([2, 9, -1, 30, 0])
    a.write(k, v, slots)
    b.write(k, v, slots)
    for name in a.planes:
        assert torch.equal(_bytes(a.planes[name]), _bytes(b.planes[name])), name
    with pytest.raises(ValueError, match="slot 32 is past the cache's 32 slots"):
        b.write(k, v, torch.tensor([0, 1, 2, 3, 32]))


def _fill(scheme, B, lens, H, D, bs, g, dtype, kernels):
    """Pages holding B sequences of the given lengths under a scattered block table, written by
    ``kernels``, and the raw keys and values [B, T, H, D]."""
    T = int(max(lens))
    per = -(-T // bs)
    nb = B * per + 3
    pages = _pages(scheme, nb, bs, H, D, dtype, kernels)
    table = torch.randperm(nb, generator=g)[: B * per].view(B, per).to(torch.int32)
    k = (torch.randn(B, T, H, D, generator=g) * 2).to(dtype)
    v = torch.randn(B, T, H, D, generator=g).to(dtype)
    pos = torch.arange(T)
    slots = table.long()[:, pos // bs] * bs + pos % bs
    slots = torch.where(pos[None] < torch.as_tensor(lens)[:, None], slots, -1)
    pages.write(k.flatten(0, 1), v.flatten(0, 1), slots.flatten())
    return pages, table, k, v


#: (scheme, D, H, G, lengths, block size)
DECODE_CASES = [
    (None, 64, 2, 4, [1, 37, 70], 16),
    ("kv-fp8", 128, 8, 4, [50, 1], 16),
    ("kv-fp8-head", 80, 3, 1, [33, 64, 5], 8),
    ("kv-fp8-token", 256, 1, 8, [20, 41], 16),
    ("kv-fp8e5m2", 64, 4, 8, [1, 70, 9], 16),
    ("kv-fp8e5m2-head", 128, 2, 3, [66], 32),
    ("kv-int8", 80, 1, 1, [1], 16),
    ("kv-int8-head", 64, 5, 2, [17, 3], 4),
    ("kv-int8-token", 128, 8, 4, [70, 12, 1, 64], 16),
    ("kv-int8-g32", 256, 2, 4, [45, 2], 16),
    (KVCacheScheme("int8", "group", 8), 80, 2, 5, [29, 40], 16),
    (KVCacheScheme("fp8_e4m3", "group", 16), 64, 3, 8, [55], 8),
]

#: (scheme, D, H, G, lengths, block size): every preset, N = 1, H 1..4, head_dim 64 / 128 / 256
TQ_DECODE_CASES = [
    ("kv-tq-k8v4", 128, 2, 4, [1, 37, 70], 16),
    ("kv-tq-k8v4", 80, 3, 2, [33, 5], 8),
    ("kv-tq-4bit-nc", 64, 1, 8, [50, 1], 16),
    ("kv-tq-4bit-nc", 256, 4, 2, [20, 41], 16),
    ("kv-tq-k3v4-nc", 128, 3, 3, [66, 2, 19], 32),
    ("kv-tq-k3v4-nc", 64, 4, 1, [1], 4),
    ("kv-tq-3bit-nc", 256, 2, 4, [45, 2], 16),
    ("kv-tq-3bit-nc", 128, 1, 5, [70, 12, 1, 64], 8),
    (TurboQuantScheme(4, 4), 16, 2, 2, [30], 8),
    (TurboQuantScheme(8, 3), 72, 2, 2, [29, 40], 16),
    (TurboQuantScheme(4, 3, True), 128, 2, 4, [55], 16),
]

OPTS = ("plain", "window+softcap", "mask+sinks", "all")


def _opts(which: str, B: int, T: int, Hq: int, g: torch.Generator) -> dict:
    mask = torch.rand(B, T, generator=g) > 0.25
    sinks = torch.randn(Hq, generator=g)
    return {
        "plain": {},
        "window+softcap": {"window": 9, "softcap": 5.0},
        "mask+sinks": {"mask": mask, "sinks": sinks},
        "all": {"window": 20, "softcap": 30.0, "mask": mask, "sinks": sinks},
    }[which]


def _oracle(q, pages, table, lens, T, kw):
    """attention_reference over the cache dequantized to fp32 (``KVPages.read`` without its cast to the
    cache dtype, which would round a quantized bf16 cache's keys), q at position len - 1."""
    bs = pages.block_size
    slots = (table.long()[:, : -(-T // bs), None] * bs + torch.arange(bs)).flatten(1)[:, :T]
    kd, vd = decode(pages.scheme, gather(pages.flat(), slots), pages.head_dim, pages.k_scale, pages.v_scale)
    kd, vd = kd.transpose(1, 2), vd.transpose(1, 2)
    ref_kw = {**kw, "mask": kw["mask"][:, None, :T] if "mask" in kw else None}
    q_pos = (torch.as_tensor(lens) - 1)[:, None]
    return attention_reference(q[:, :, None], kd, vd, scale=pages.head_dim**-0.5, q_pos=q_pos, **ref_kw)[
        :, :, 0
    ]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


@pytest.mark.parametrize(
    "case",
    DECODE_CASES + TQ_DECODE_CASES,
    ids=lambda c: f"{c[0] if isinstance(c[0], str) else _id(c[0])}-D{c[1]}",
)
def test_decode_fp32_matches_torch_and_oracle(case) -> None:
    name, D, H, G, lens, bs = case
    scheme = parse_kv_scheme(name) if isinstance(name, str) else name
    g = torch.Generator().manual_seed(D * 31 + H * 7 + G)
    B, T = len(lens), max(lens)
    pages, table, _, _ = _fill(scheme, B, lens, H, D, bs, g, torch.float32, NativeKV())
    q = torch.randn(B, H * G, D, generator=g)
    seq = torch.tensor(lens, dtype=torch.int32)
    for which in OPTS:
        kw = _opts(which, B, T, H * G, g)
        out = NativeKV().decode(q, pages, table, seq, T, scale=D**-0.5, **kw)
        tref = torch_decode_attention(q, pages, table, seq, T, scale=D**-0.5, **kw)
        oref = _oracle(q, pages, table, lens, T, kw)
        assert out.shape == q.shape and out.dtype == q.dtype
        e_t, e_o = rel(out, tref), rel(out, oref)
        print(f"{_id(scheme)} D={D} H={H} G={G} {which}: rel err vs torch {e_t:.2e}, vs oracle {e_o:.2e}")
        assert e_t < FP32_TOL and e_o < FP32_TOL, (which, e_t, e_o)
        assert torch.allclose(out, oref, atol=1e-5, rtol=1e-4), which


@pytest.mark.parametrize("cache", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("name", [None, "kv-fp8", "kv-int8-token", "kv-tq-k8v4", "kv-tq-4bit-nc"])
def test_decode_16bit_within_one_rounding(cache: torch.dtype, name: str | None) -> None:
    """A 16-bit query and cache: the output is the fp32 result rounded once to the query's dtype."""
    scheme = None if name is None else parse_kv_scheme(name)
    rotated = isinstance(scheme, TurboQuantScheme) and scheme.key_bits != 8
    g = torch.Generator().manual_seed(11)
    lens, H, G, D = [1, 90, 47], 2, 4, 128
    pages, table, _, _ = _fill(scheme, 3, lens, H, D, 16, g, cache, NativeKV())
    q = torch.randn(3, H * G, D, generator=g).to(cache)
    seq = torch.tensor(lens, dtype=torch.int32)
    for which in OPTS:
        kw = _opts(which, 3, 90, H * G, g)
        out = NativeKV().decode(q, pages, table, seq, 90, scale=D**-0.5, **kw)
        tref = torch_decode_attention(q, pages, table, seq, 90, scale=D**-0.5, **kw)
        oref = _oracle(q.float(), pages, table, lens, 90, kw)
        assert out.dtype == cache
        eps = 2**-8 if cache == torch.bfloat16 else 2**-11 if cache == torch.float16 else 1e-6
        # rotated TurboQuant keys are scored against the rotated query (another fp32 sum order than
        # the oracle's q.k), visible only where the output keeps fp32
        floor = 4e-6 if rotated and cache == torch.float32 else 1e-6
        bound = eps * oref.abs() + floor
        assert bool(((out.float() - oref).abs() <= bound).all()), (
            which,
            float((out.float() - oref).abs().max()),
        )
        print(
            f"{cache} {name}: {which} rel err vs oracle {rel(out, oref):.2e}, vs torch path {rel(out, tref):.2e}"
        )
        assert rel(out, tref) < 2 * eps


@pytest.mark.parametrize("name", [None, "kv-fp8-token", "kv-int8-g32", "kv-tq-4bit-nc", "kv-tq-3bit-nc"])
def test_long_context_splits_match(name: str | None) -> None:
    """B * H below the threads' want: the context splits (flash decoding) and merges exactly."""
    scheme = None if name is None else parse_kv_scheme(name)
    g = torch.Generator().manual_seed(13)
    lens, H, G, D = [1500], 1, 4, 64
    assert kv_native.splits_for(1, 1, 1500, 2) > 1
    pages, table, _, _ = _fill(scheme, 1, lens, H, D, 16, g, torch.float32, NativeKV())
    q = torch.randn(1, H * G, D, generator=g)
    seq = torch.tensor(lens, dtype=torch.int32)
    n = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for which in OPTS:
                kw = _opts(which, 1, 1500, H * G, g)
                if "window" in kw:
                    kw["window"] = 700  # spans several splits
                out = NativeKV().decode(q, pages, table, seq, 1500, scale=D**-0.5, **kw)
                oref = _oracle(q, pages, table, lens, 1500, kw)
                e = rel(out, oref)
                print(f"{name} L=1500 threads={threads} {which}: rel err vs oracle {e:.2e}")
                assert e < FP32_TOL, (threads, which, e)
    finally:
        torch.set_num_threads(n)


def test_decode_edge_cases() -> None:
    """Nothing attended (a mask of zeros) gives 0, or 0 beside a sink; max_len below a length cuts
    it; a non-bool mask and an expanded mask (stride 0) are read as the torch path reads them."""
    g = torch.Generator().manual_seed(17)
    pages, table, _, _ = _fill(
        parse_kv_scheme("kv-int8"), 2, [30, 20], 2, 64, 8, g, torch.float32, NativeKV()
    )
    q = torch.randn(2, 4, 64, generator=g)
    seq = torch.tensor([30, 20], dtype=torch.int32)
    none = torch.zeros(2, 30, dtype=torch.bool)
    for kw in ({"mask": none}, {"mask": none, "sinks": torch.randn(4, generator=g)}):
        out = NativeKV().decode(q, pages, table, seq, 30, scale=0.125, **kw)
        assert torch.equal(out, torch.zeros_like(out))
        assert torch.equal(out, torch_decode_attention(q, pages, table, seq, 30, scale=0.125, **kw))
    for kw in (
        {"mask": (torch.rand(2, 30, generator=g) > 0.5).float()},
        {"mask": (torch.rand(1, 30, generator=g) > 0.3).expand(2, 30)},
    ):
        a = NativeKV().decode(q, pages, table, seq, 25, scale=0.125, **kw)
        b = torch_decode_attention(q, pages, table, seq, 25, scale=0.125, **kw)
        assert rel(a, b) < FP32_TOL
    with pytest.raises(ValueError, match="block_table"):
        NativeKV().decode(q, pages, table[:, :2], seq, 30, scale=0.125)


def test_supports_reasons() -> None:
    nk, cpu = NativeKV(), torch.device("cpu")
    for s in TQ_SCHEMES:
        for D in (16, 64, 128, 256):
            assert nk.supports(s, D, torch.bfloat16, cpu).ok, (s, D)
    v = nk.supports(parse_kv_scheme("kv-tq-4bit-nc"), 80, torch.bfloat16, cpu)
    assert not v.ok and "power-of-two" in v.reason and "head_dim=80" in v.reason
    assert nk.supports(parse_kv_scheme("kv-tq-k8v4"), 80, torch.bfloat16, cpu).ok  # keys unrotated
    assert not nk.supports(parse_kv_scheme("kv-tq-3bit-nc"), 4, torch.bfloat16, cpu).ok
    assert not nk.supports(None, 128, torch.float64, cpu).ok
    assert not nk.supports(None, 128, torch.bfloat16, torch.device("meta")).ok
    for s in SCHEMES:
        for D in (64, 80, 128, 256):
            assert nk.supports(s, D, torch.bfloat16, cpu).ok


@pytest.fixture
def registered():
    """NativeKV registered for CPU caches as backends/cpu/__init__.py would (removed afterwards)."""
    from quantrt.kernels import registry

    kv = registry().kv.setdefault("cpu", [])
    mine = [k for k in kv if k.name == "native"]
    if not mine:
        registry().register_kv("cpu", NativeKV())
    yield
    if not mine:
        kv[:] = [k for k in kv if k.name != "native"]


def test_registered_kernels_are_chosen(registered, monkeypatch) -> None:
    monkeypatch.delenv("QUANTRT_KV_BACKEND", raising=False)
    p = KVPages(parse_kv_scheme("kv-fp8-token"), 8, 16, 2, 64)
    assert p.kernels.name == "native" and [n for n, _ in p.verdicts] == ["native", "torch"]
    for name in TQ_PRESETS:
        assert KVPages(parse_kv_scheme(name), 8, 16, 2, 64).kernels.name == "native"
    g = torch.Generator().manual_seed(19)
    k, v = torch.randn(40, 2, 64, generator=g).bfloat16(), torch.randn(40, 2, 64, generator=g).bfloat16()
    p.write(k, v, torch.arange(40))
    q = torch.randn(2, 8, 64, generator=g).bfloat16()
    table = torch.arange(8, dtype=torch.int32).view(2, 4)
    seq = torch.tensor([40, 17], dtype=torch.int32)
    out = decode_attention(q, p, table, seq, 64, scale=0.125)
    assert rel(out, torch_decode_attention(q, p, table, seq, 64, scale=0.125)) < 2**-7
    monkeypatch.setenv("QUANTRT_KV_BACKEND", "torch")
    assert KVPages(None, 8, 16, 2, 64).kernels.name == "torch"
    assert os.environ["QUANTRT_KV_BACKEND"] == "torch"
