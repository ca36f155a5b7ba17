"""The Triton KV-cache kernels (``backends/triton/kv.py`` through ``backends/triton/kv_kernel.TritonKV``) against
the torch codec and the attention oracle, for every scheme of ``KV_CATALOG`` and the unquantized cache.

Write: the planes TritonKV writes equal the torch codec's (``KVPages`` with ``TorchKV`` on the CPU,
same inputs) bit for bit: static scales calibrated on a first write that a second, larger write
saturates, an all-zero head (scale 1), a constant one, a slot of -1 skipped, head_dim 64 and one
that is not a power of two. The one allowed difference: TurboQuant keys, rotated by a Walsh-Hadamard
transform that sums in another order than ``x @ R``: codes at least 99.9% equal and the rest one
level off (a rotated value within rounding of a boundary), norms at most 1 ulp apart where the
codes agree (99.9% equal) and within 2% where they do not.

Decode: against ``attention_reference`` over the dequantized cache (``KVPages.read``): a random
permuted block table of 16-slot pages, ragged lengths (37, 1, 50, 0), GQA with G = 1 and 3, every
option at once (window, softcap, sinks, a mask), with the default launch and with forced ones
(16/32-token tiles, 2-3 splits merged by the second kernel, transposed or not). 4-bit TurboQuant
codes go through the shared-memory pair tables in the default launch (TritonKV gives no decoders)
and as 16-bit words through the portable decoders in the forced ones; NVIDIA's PTX decoders where
a GPU runs them (their compile and an emulation: tests/triton/test_kv_compiles.py). Each scheme's
error against attention over the unquantized keys and values is printed and loosely bounded.

On the CPU it runs under TRITON_INTERPRET=1 with fp16 and fp32 (the interpreter's bf16 dot is
wrong); tests/gpu/test_kv_cuda.py repeats the checks in bf16 and fp16 at real sizes.
"""

from __future__ import annotations

import pytest
import torch

from quantrt.backends.cuda.policy import CUDA
from quantrt.backends.triton import kv
from quantrt.backends.triton.kv import DecodeConfig, decode_config, decode_kv, kv_format
from quantrt.backends.triton.kv_kernel import TritonKV
from quantrt.kv.kernels import TorchKV, decode_attention
from quantrt.kv.pages import KVPages
from quantrt.kv.reference import attention_reference
from quantrt.reference import turboquant as tq
from quantrt.schemes import KV_CATALOG, KVCacheScheme, TurboQuantScheme, parse_kv_scheme

DEV = "cuda" if torch.cuda.is_available() else "cpu"
SCHEMES = [None, *KV_CATALOG]
DTYPES = [torch.float16, torch.float32]
#: max |out - oracle| over outputs of magnitude ~1: fp16 probabilities, codes' fp16 operands and the
#: fp16 output (the oracle reads the cache dequantized to its dtype); fp32 is exact up to summation
ATOL = {torch.float16: 6e-3, torch.float32: 2e-5}
#: rel. Frobenius error against attention over the unquantized keys and values (random normal data,
#: head_dim 64): what each storage costs, bounded loosely
QUANT_ERROR = {
    None: 2e-3,
    "int8": 0.03,
    "fp8_e4m3": 0.08,
    "fp8_e5m2": 0.12,
    "kv-tq-k8v4": 0.15,
    "kv-tq-4bit-nc": 0.2,
    "kv-tq-k3v4-nc": 0.3,
    "kv-tq-3bit-nc": 0.35,
}


def scheme_of(name: str | None):  # type: ignore[no-untyped-def]
    return parse_kv_scheme(name) if name else None


def head_dims(name: str | None) -> list[int]:
    """64, and a head_dim that is not a power of two where the scheme allows one."""
    s = scheme_of(name)
    if isinstance(s, TurboQuantScheme):
        return [64, 80] if s.key_bits == 8 else [64]
    if isinstance(s, KVCacheScheme) and s.granularity == "group":
        return [64, 96]
    return [64, 80]


def triton_pages(
    name: str | None, num_blocks: int, heads: int, dim: int, dtype: torch.dtype, block_size: int = 16
) -> KVPages:
    pages = KVPages(scheme_of(name), num_blocks, block_size, heads, dim, dtype=dtype, device=DEV)
    pages.kernels = TritonKV(CUDA, "triton")  # on the CPU the cache picks torch; the interpreter runs these
    return pages


def on_cpu(pages: KVPages) -> KVPages:
    """The same cache on the CPU, read by the torch codec there (its TurboQuant constants are CPU
    tensors)."""
    c = KVPages(
        pages.scheme, pages.num_blocks, pages.block_size, pages.num_kv_heads, pages.head_dim,
        dtype=pages.dtype, k_scale=pages.k_scale, v_scale=pages.v_scale,
    )  # fmt: skip
    c.kernels = TorchKV()
    for n, p in pages.planes.items():
        c.planes[n].copy_(p.cpu())
    return c


def quant_error_bound(name: str | None) -> float:
    s = scheme_of(name)
    if isinstance(s, KVCacheScheme):
        return QUANT_ERROR[s.dtype]
    return QUANT_ERROR[name]


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    y64, r64 = y.double().cpu(), ref.double().cpu()
    return float((y64 - r64).norm() / r64.norm())


# -- quantize-on-write ------------------------------------------------------------------------


def _write_inputs(n: int, heads: int, dim: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    k = torch.randn(n, heads, dim, generator=g) * 2
    v = torch.randn(n, heads, dim, generator=g) + 0.5
    k[3, 0, 5] = 40.0  # an outlier
    k[5, 1] = 0.0  # an all-zero head: dynamic scale 1, norm 0
    v[7, 2] = 0.0
    v[8, 0] = 1.25  # a constant head: TurboQuant value scale 0
    return k, v


def assert_norms(want: torch.Tensor, got: torch.Tensor, same_codes: torch.Tensor) -> None:
    """TurboQuant's fp16 key norms: where the codes agree, equal but for the odd last-bit rounding
    of a norm summed in another order (at most 1 ulp, 99.9% exact); elsewhere within 2% (they are
    divided by the chosen centroids' norm)."""
    ulp = (want.view(torch.int16).int() - got.view(torch.int16).int()).abs()  # norms are >= 0
    assert not same_codes.any() or int(ulp[same_codes].max()) <= 1
    assert float((ulp == 0).double().mean()) >= 0.999
    assert torch.allclose(want[~same_codes].float(), got[~same_codes].float(), rtol=2e-2)


def _assert_tq_keys(ref: KVPages, mine: KVPages, scheme: TurboQuantScheme) -> None:
    a = tq.unpack_bits(ref.planes["k"], scheme.key_bits)
    b = tq.unpack_bits(mine.planes["k"], scheme.key_bits)
    diff = (a - b).abs()
    assert int(diff.max()) <= 1, "key codes more than one level apart"
    assert float((diff == 0).double().mean()) >= 0.999
    assert_norms(ref.planes["k_norm"], mine.planes["k_norm"], (diff == 0).all(-1))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", SCHEMES, ids=str)
def test_write_matches_torch_codec(name: str | None, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(11)
    scheme = scheme_of(name)
    for dim in head_dims(name):
        heads, n, blocks = 3, 24, 3
        k, v = _write_inputs(n, heads, dim, g)
        k, v = k.to(dtype), v.to(dtype)
        slots = torch.randperm(blocks * 16, generator=g)[:n]
        slots[4] = -1
        ref = KVPages(scheme, blocks, 16, heads, dim, dtype=dtype)
        ref.kernels = TorchKV()  # the torch codec is the reference (the CPU would pick its native kernels)
        mine = triton_pages(name, blocks, heads, dim, dtype)
        for pages in (ref, mine):
            # the first write calibrates static scales; the second, 4x larger, saturates them
            dev = pages.device
            pages.write(k[:12].to(dev), v[:12].to(dev), slots[:12].to(dev))
            pages.write(4 * k[12:].to(dev), 4 * v[12:].to(dev), slots[12:].to(dev))
        mine = on_cpu(mine)
        for plane, want in ref.planes.items():
            got = mine.planes[plane]
            if plane == "k" and isinstance(scheme, TurboQuantScheme) and scheme.key_bits != 8:
                continue
            if plane == "k_norm":
                continue
            assert got.dtype == want.dtype
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), (
                f"{name} D={dim}: plane {plane}"
            )
        if isinstance(scheme, TurboQuantScheme) and scheme.key_bits != 8:
            _assert_tq_keys(ref, mine, scheme)


# -- decode attention ------------------------------------------------------------------------------

LENS = (37, 1, 50, 0)


def _filled_pages(
    name: str | None, dtype: torch.dtype, dim: int, heads: int, g: torch.Generator, bs: int = 16
) -> tuple[KVPages, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A cache holding ragged sequences through a random permuted block table of ``bs``-slot pages:
    (pages, block table, lengths, and the unquantized keys and values [B, H, T, D])."""
    B, T = len(LENS), max(LENS)
    per = -(-T // bs)
    pages = triton_pages(name, B * per + 3, heads, dim, dtype, bs)
    table = torch.randperm(B * per + 3, generator=g)[: B * per].view(B, per).int()
    k = torch.randn(B, T, heads, dim, generator=g)
    v = torch.randn(B, T, heads, dim, generator=g)
    t = torch.arange(T)
    lens = torch.tensor(LENS, dtype=torch.int32)
    slots = table.long()[:, t // bs] * bs + t % bs
    live = (t[None, :] < lens[:, None]).flatten()  # only the live tokens (-1 slots: the write test)
    kw, vw = k.flatten(0, 1)[live], v.flatten(0, 1)[live]
    pages.write(kw.to(DEV, dtype), vw.to(DEV, dtype), slots.flatten()[live].to(DEV))
    return pages, table.to(DEV), lens.to(DEV), k.transpose(1, 2), v.transpose(1, 2)


def forced_decode(q, pages, table, lens, max_len, config, **kw):  # type: ignore[no-untyped-def]
    """The launcher with a given launch shape (TritonKV picks its own)."""
    return decode_kv(
        q, pages.scheme, pages.flat(), pages.block_size, table, lens, max_len, config=config,
        k_scale=pages.k_scale, v_scale=pages.v_scale, tables=pages.kernels.tables(pages), **kw,
    )  # fmt: skip


def _oracle(q, k, v, lens, **kw):  # type: ignore[no-untyped-def]
    mask = kw.get("mask")
    T = k.shape[2]
    return attention_reference(
        q[:, :, None].float().cpu(), k.float().cpu(), v.float().cpu(), scale=kw["scale"],
        q_pos=(lens.long().cpu() - 1)[:, None], window=kw.get("window"), softcap=kw.get("softcap"),
        sinks=None if kw.get("sinks") is None else kw["sinks"].cpu(),
        mask=None if mask is None else mask[:, None, :T].cpu(),
    )[:, :, 0]  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", SCHEMES, ids=str)
def test_decode_matches_oracle(name: str | None, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(7)
    heads = 2
    # fp32 checks the arithmetic at head_dim 64; fp16 also the padded head_dim
    for dim in head_dims(name) if dtype == torch.float16 else [64]:
        pages, table, lens, _, _ = _filled_pages(name, dtype, dim, heads, g)
        T = max(LENS)
        kd, vd = on_cpu(pages).read(table.cpu(), T)  # the dequantized cache, in the cache's dtype
        default = decode_config(len(LENS), heads, T, dim, 132, kv_format(pages.scheme, dim))
        # the default launch (one split here), then the other score layout, small tiles and splits
        forced = DecodeConfig(16, 3 if dim == 64 else 2, transposed=not default.transposed)
        for G, opts, config in [(1, {}, None), (3, {"window": 20, "softcap": 5.0}, forced)]:
            q = torch.randn(len(LENS), heads * G, dim, generator=g).to(DEV, dtype)
            kw = dict(scale=dim**-0.5, **opts)
            if opts:
                kw["sinks"] = torch.randn(heads * G, generator=g).to(DEV)
                kw["mask"] = (torch.rand(len(LENS), T + 5, generator=g) > 0.25).to(DEV)
            if config is None:
                out = decode_attention(q, pages, table, lens, T, **kw)
            else:
                out = forced_decode(q, pages, table, lens, T, config, decoders=kv.PORTABLE_DECODERS, **kw)
            assert out.dtype == dtype and out.shape == q.shape
            ref = _oracle(q, kd, vd, lens, **kw)
            err = (out.float().cpu() - ref).abs().max().item()
            assert err <= ATOL[dtype], f"{name} D={dim} G={G} {opts} {config}: max error {err:.2e}"
            assert torch.all(out[3].float() == 0)  # the empty sequence


@pytest.mark.parametrize("dim", [64, 80, 74])  # 80, 74: padded to 128 (74: 37 words, not a multiple of 4)
@pytest.mark.parametrize("name", ["kv-fp8", "kv-fp8e5m2", "kv-fp8-token"])
def test_decode_byte_words(name: str, dim: int) -> None:
    """fp8 values read as byte-pair words (one accumulator per byte, interleaved after the loop)
    against the oracle: two tiles, one or several splits, either score layout, GQA, window, softcap,
    sinks and mask; the path
    is the one taken (``byte_words``) and the byte-per-element one gives the same result."""
    g = torch.Generator().manual_seed(31)
    pages, table, lens, _, _ = _filled_pages(name, torch.float16, dim, 2, g)
    T = max(LENS)
    kd, vd = on_cpu(pages).read(table.cpu(), T)
    fmt = kv_format(pages.scheme, dim)
    q = torch.randn(len(LENS), 6, dim, generator=g).to(DEV, torch.float16)
    kw = dict(scale=dim**-0.5, window=40, softcap=5.0)
    kw["sinks"] = torch.randn(6, generator=g).to(DEV)
    kw["mask"] = (torch.rand(len(LENS), T + 5, generator=g) > 0.25).to(DEV)
    ref = _oracle(q, kd, vd, lens, **kw)
    assert kv.byte_words(fmt, q.dtype, pages.flat()["v"], dim, kv.PORTABLE_DECODERS)
    for config in (
        DecodeConfig(16, 3),
        DecodeConfig(32, 1, num_stages=2),
        DecodeConfig(16, 2, transposed=True),
    ):
        out = forced_decode(q, pages, table, lens, T, config, decoders=kv.PORTABLE_DECODERS, **kw)
        err = (out.float().cpu() - ref).abs().max().item()
        assert err <= ATOL[torch.float16], f"{name} D={dim} {config}: max error {err:.2e}"
        bytewise = forced_decode(q, pages, table, lens, T, config, **kw)  # no decoders: byte by byte
        assert (out.float() - bytewise.float()).abs().max().item() <= 2e-3


@pytest.mark.parametrize("name", ["kv-int8", "kv-int8-token"])
def test_int8_values_stay_byte_by_byte(name: str) -> None:
    """int8 values are not read as words (slower on the GPU: docs/performance.md)."""
    pages, _, _, _, _ = _filled_pages(name, torch.float16, 64, 2, torch.Generator().manual_seed(3))
    assert not kv.byte_words(
        kv_format(pages.scheme, 64), torch.float16, pages.flat()["v"], 64, kv.PORTABLE_DECODERS
    )


@pytest.mark.parametrize("bs", [8, 24, 64])
def test_decode_any_page_size(bs: int) -> None:
    """Pages smaller than a tile (whole pages per tile), not dividing it, and holding several tiles."""
    g = torch.Generator().manual_seed(5)
    pages, table, lens, _, _ = _filled_pages("kv-int8-token", torch.float16, 64, 2, g, bs)
    T = max(LENS)
    kd, vd = on_cpu(pages).read(table.cpu(), T)
    q = torch.randn(len(LENS), 4, 64, generator=g).to(DEV, torch.float16)
    out = forced_decode(q, pages, table, lens, T, DecodeConfig(16, 2), scale=0.125, window=30)
    err = (out.float().cpu() - _oracle(q, kd, vd, lens, scale=0.125, window=30)).abs().max().item()
    assert err <= ATOL[torch.float16]


@pytest.mark.parametrize(
    "name, dim, words",
    [("kv-tq-4bit-nc", 64, False), ("kv-tq-k8v4", 64, False), ("kv-tq-k8v4", 74, True)],
    ids=["4bit-pairs", "k8v4-pairs", "k8v4-odd-words"],
)
def test_decode_tq_pair_tables(monkeypatch: pytest.MonkeyPatch, name: str, dim: int, words: bool) -> None:
    """Decoders given, 4-bit codes through the shared-memory pair tables all the same: under
    ``QUANTRT_KV_TQ_DECODE=pairs``, and where a row's bytes do not make whole 16-bit words (head_dim
    74: 37 bytes of value codes)."""
    monkeypatch.setattr(kv, "_TQ_WORDS", words)
    g = torch.Generator().manual_seed(9)
    pages, table, lens, _, _ = _filled_pages(name, torch.float16, dim, 2, g)
    T = max(LENS)
    kd, vd = on_cpu(pages).read(table.cpu(), T)
    q = torch.randn(len(LENS), 6, dim, generator=g).to(DEV, torch.float16)
    for config in (None, DecodeConfig(16, 2, transposed=False)):
        out = forced_decode(q, pages, table, lens, T, config, scale=dim**-0.5, decoders=kv.PORTABLE_DECODERS)
        err = (out.float().cpu() - _oracle(q, kd, vd, lens, scale=dim**-0.5)).abs().max().item()
        assert err <= ATOL[torch.float16], f"{name} D={dim} {config}: max error {err:.2e}"


@pytest.mark.parametrize("name", ["kv-tq-4bit-nc", "kv-tq-k8v4", "kv-tq-k3v4-nc"])
def test_decode_nvidia_decoders(name: str) -> None:
    """The PTX decoders of ``backends/cuda/triton_kv_decode.py`` on a GPU; under the interpreter
    (which runs no inline assembly) the portable ones stand in for them."""
    from quantrt.backends.cuda.triton_kv_decode import DECODERS

    g = torch.Generator().manual_seed(13)
    pages, table, lens, _, _ = _filled_pages(name, torch.float16, 64, 2, g)
    T = max(LENS)
    kd, vd = on_cpu(pages).read(table.cpu(), T)
    q = torch.randn(len(LENS), 8, 64, generator=g).to(DEV, torch.float16)
    out = forced_decode(q, pages, table, lens, T, None, scale=0.125, decoders=DECODERS)
    err = (out.float().cpu() - _oracle(q, kd, vd, lens, scale=0.125)).abs().max().item()
    assert err <= ATOL[torch.float16], f"{name}: max error {err:.2e}"


def test_centroid_bits() -> None:
    """The code book's fp16 bits on the host, read once when the tables are made."""
    pages = triton_pages("kv-tq-4bit-nc", 2, 1, 128, torch.float16)
    t = pages.kernels.tables(pages)
    want = t.centroids.to(torch.float16).view(torch.int16).cpu()
    assert list(t.centroid_bits()) == [b & 0xFFFF for b in want.tolist()]


@pytest.mark.parametrize("name", SCHEMES, ids=str)
def test_decode_error_against_unquantized(name: str | None) -> None:
    g = torch.Generator().manual_seed(3)
    pages, table, lens, k, v = _filled_pages(name, torch.float16, 64, 2, g)
    q = torch.randn(len(LENS), 4, 64, generator=g)
    out = decode_attention(q.to(DEV, torch.float16), pages, table, lens, max(LENS), scale=0.125)
    ref = _oracle(q, k, v, lens, scale=0.125)
    err = rel(out[:3], ref[:3])
    print(f"\n{name}: decode error against the unquantized cache {err:.4f}")
    assert err <= quant_error_bound(name)


# -- launch shapes and verdicts ------------------------------------------------------------------


def test_decode_config_fills_the_gpu_once() -> None:
    fmt = kv_format(parse_kv_scheme("kv-fp8"), 128)
    one = decode_config(1, 8, 32768, 128, 132, fmt)
    assert one.num_splits == 33 and one.block_n == 64 and not one.transposed
    assert decode_config(16, 8, 32768, 128, 132, fmt).num_splits == 2
    assert decode_config(64, 8, 32768, 128, 132, fmt).num_splits == 1
    assert decode_config(1, 8, 300, 128, 132, fmt).num_splits == 3  # at least 128 tokens a split
    tq4 = decode_config(1, 8, 32768, 128, 132, kv_format(parse_kv_scheme("kv-tq-4bit-nc"), 128))
    assert tq4.transposed and tq4.block_n == 128
    assert decode_config(1, 8, 32768, 128, 132, kv_format(None, 128)).block_n == 64


def test_supports(monkeypatch: pytest.MonkeyPatch) -> None:
    kv = TritonKV(CUDA, "triton")
    fp8 = parse_kv_scheme("kv-fp8")
    no = kv.supports(fp8, 128, torch.bfloat16, torch.device("cpu"))
    assert not no and no.predicate == "an NVIDIA GPU" and no.values["device"] == "cpu"
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    cuda = torch.device("cuda", 0)
    assert not kv.supports(fp8, 128, torch.int8, cuda)
    assert "head_dim" in kv.supports(fp8, 8, torch.float16, cuda).predicate
    assert kv.supports(fp8, 512, torch.float16, cuda).values == {"head_dim": 512}
    for name in SCHEMES:
        assert kv.supports(scheme_of(name), 128, torch.bfloat16, cuda), name
    assert kv.supports(None, 80, torch.float32, cuda)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (7, 5))
    old = kv.supports(fp8, 128, torch.float16, cuda)
    assert not old and old.predicate == "sm >= 80" and old.values == {"sm": "75"}
    monkeypatch.setattr(torch.version, "hip", "7.1")  # ROCm torch: AMD's kernels, not these
    assert kv.supports(fp8, 128, torch.float16, cuda).predicate == "an NVIDIA GPU"
