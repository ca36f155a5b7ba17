"""The Triton KV-cache kernels (``backends/triton/kv_kernel.TritonKV``) on a real GPU, in bf16 and fp16 at
realistic sizes (head_dim 128, GQA with G = 4, a few thousand tokens): a CUDA cache picks them for
every scheme; writes equal the torch codec's planes (TurboQuant key codes within one level at a
boundary); decode matches ``attention_reference`` over the dequantized cache, with a random
permuted block table, ragged lengths and every option; fp8 through the hardware conversion and
through the bit tricks gives the same codes and outputs; write + decode capture into a CUDA graph
and replay with new inputs and lengths. tests/triton/test_kv_triton.py has the awkward shapes."""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    # importing Triton kernels decides compiled or interpreted: collected before tests/triton's
    # conftest asks for the interpreter, it would leave every later Triton test compiled
    pytest.skip("needs a CUDA device (run by ci/gpu.sh)", allow_module_level=True)

from quantrt.backends.triton import kv as triton_kv
from quantrt.kv.kernels import TorchKV, decode_attention, write_kv
from quantrt.kv.pages import KVPages
from quantrt.kv.reference import attention_reference
from quantrt.reference import turboquant as tq
from quantrt.schemes import KV_CATALOG, TurboQuantScheme, parse_kv_scheme

DEV = "cuda"
SCHEMES = [None, *KV_CATALOG]
DTYPES = [torch.bfloat16, torch.float16]
#: rel. Frobenius error against the oracle over the dequantized cache: 16-bit probabilities and
#: output (bf16 ones for an unquantized bf16 cache; every code runs through fp16 operands)
TOL = {torch.bfloat16: 1.2e-2, torch.float16: 4e-3}
H, G, D, BS = 8, 4, 128, 16
LENS = (3000, 1, 2100, 517)


def scheme_of(name: str | None):  # type: ignore[no-untyped-def]
    return parse_kv_scheme(name) if name else None


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    y64, r64 = y.double(), ref.double()
    return float((y64 - r64).norm() / r64.norm())


def filled(name: str | None, dtype: torch.dtype, g: torch.Generator):  # type: ignore[no-untyped-def]
    """(pages, block table, lengths, unquantized keys, values [B, H, T, D]) for ragged sequences
    through a random permuted block table."""
    B, T = len(LENS), max(LENS)
    per = -(-T // BS)
    pages = KVPages(scheme_of(name), B * per + 5, BS, H, D, dtype=dtype, device=DEV)
    table = torch.randperm(B * per + 5, generator=g)[: B * per].view(B, per).int().to(DEV)
    k = torch.randn(B, T, H, D, generator=g).to(DEV)
    v = torch.randn(B, T, H, D, generator=g).to(DEV)
    t = torch.arange(T, device=DEV)
    lens = torch.tensor(LENS, dtype=torch.int32, device=DEV)
    slots = table.long()[:, t // BS] * BS + t % BS
    slots = torch.where(t[None, :] < lens[:, None], slots, -1)
    pages.write(k.flatten(0, 1).to(dtype), v.flatten(0, 1).to(dtype), slots.flatten())
    return pages, table, lens, k.transpose(1, 2), v.transpose(1, 2)


def on_cpu(pages: KVPages) -> KVPages:
    """The same cache on the CPU, for the torch codec's reads (its TurboQuant constants are CPU
    tensors)."""
    c = KVPages(
        pages.scheme, pages.num_blocks, pages.block_size, pages.num_kv_heads, pages.head_dim,
        dtype=pages.dtype, k_scale=pages.k_scale, v_scale=pages.v_scale,
    )  # fmt: skip
    c.kernels = TorchKV()
    for n, p in pages.planes.items():
        c.planes[n].copy_(p.cpu())
    return c


def dequantized(pages: KVPages, table: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The cache read back by the torch codec (on the CPU), on the GPU again."""
    k, v = on_cpu(pages).read(table.cpu(), length)
    return k.to(DEV), v.to(DEV)


def oracle(q, k, v, lens, **kw):  # type: ignore[no-untyped-def]
    mask = kw.get("mask")
    return attention_reference(
        q[:, :, None].float(), k.float(), v.float(), scale=kw["scale"], q_pos=(lens.long() - 1)[:, None],
        window=kw.get("window"), softcap=kw.get("softcap"), sinks=kw.get("sinks"),
        mask=None if mask is None else mask[:, None, : k.shape[2]],
    )[:, :, 0]  # fmt: skip


def assert_norms(want: torch.Tensor, got: torch.Tensor, same_codes: torch.Tensor) -> None:
    """TurboQuant's fp16 key norms: where the codes agree, equal but for the odd last-bit rounding
    of a norm summed in another order (at most 1 ulp, 99.9% exact); elsewhere within 2% (they are
    divided by the chosen centroids' norm)."""
    ulp = (want.view(torch.int16).int() - got.view(torch.int16).int()).abs()  # norms are >= 0
    assert not same_codes.any() or int(ulp[same_codes].max()) <= 1
    assert float((ulp == 0).double().mean()) >= 0.999
    assert torch.allclose(want[~same_codes].float(), got[~same_codes].float(), rtol=2e-2)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", SCHEMES, ids=str)
def test_cuda_cache_picks_its_kernels(name: str | None, dtype: torch.dtype) -> None:
    """4-bit TurboQuant on the CUDA C++ decode (tests/gpu/test_kv_mma.py), every other scheme on
    Triton's kernels."""
    pages = KVPages(scheme_of(name), 4, BS, H, D, dtype=dtype, device=DEV)
    want = "cuda.mma" if name == "kv-tq-4bit-nc" else "triton"
    assert pages.kernels.name == want, pages.verdicts
    assert dict(pages.verdicts)["triton"].ok


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", SCHEMES, ids=str)
def test_write_matches_torch_codec(name: str | None, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(1)
    n = 3000
    k = (torch.randn(n, H, D, generator=g) * 3).to(DEV, dtype)
    v = torch.randn(n, H, D, generator=g).to(DEV, dtype)
    slots = torch.randperm(200 * BS, generator=g)[:n].to(DEV)
    slots[::97] = -1
    ref = KVPages(scheme_of(name), 200, BS, H, D, dtype=dtype)
    ref.kernels = TorchKV()  # the torch codec is the reference (the CPU would pick its native kernels)
    mine = KVPages(scheme_of(name), 200, BS, H, D, dtype=dtype, device=DEV)
    for pages in (ref, mine):
        dev = pages.device
        pages.write(k[:1000].to(dev), v[:1000].to(dev), slots[:1000].to(dev))
        # past the calibrated static scales
        pages.write(2 * k[1000:].to(dev), 2 * v[1000:].to(dev), slots[1000:].to(dev))
    mine = on_cpu(mine)
    scheme = scheme_of(name)
    rotated = isinstance(scheme, TurboQuantScheme) and scheme.key_bits != 8
    for plane, want in ref.planes.items():
        if rotated and plane in ("k", "k_norm"):
            continue
        assert torch.equal(mine.planes[plane].view(torch.uint8), want.view(torch.uint8)), plane
    if rotated:
        a = tq.unpack_bits(ref.planes["k"], scheme.key_bits)
        b = tq.unpack_bits(mine.planes["k"], scheme.key_bits)
        diff = (a - b).abs()
        assert int(diff.max()) <= 1 and float((diff == 0).double().mean()) >= 0.999
        assert_norms(ref.planes["k_norm"], mine.planes["k_norm"], (diff == 0).all(-1))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", SCHEMES, ids=str)
def test_decode_matches_oracle(name: str | None, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(2)
    pages, table, lens, k, v = filled(name, dtype, g)
    T = max(LENS)
    kd, vd = dequantized(pages, table, T)
    B = len(LENS)
    for opts in ({}, {"window": 700, "softcap": 30.0}):
        q = torch.randn(B, H * G, D, generator=g).to(DEV, dtype)
        kw = dict(scale=D**-0.5, **opts)
        if opts:
            kw["sinks"] = torch.randn(H * G, generator=g).to(DEV)
            kw["mask"] = torch.rand(B, T + 64, generator=g).to(DEV) > 0.1
        out = decode_attention(q, pages, table, lens, T, **kw)
        assert out.dtype == dtype
        err = rel(out.float(), oracle(q, kd, vd, lens, **kw))
        assert err <= TOL[dtype], f"{name} {opts}: {err:.2e}"
        if not opts:
            quant = rel(out.float(), oracle(q, k, v, lens, **kw))
            print(f"\n{name} {dtype}: error against the unquantized cache {quant:.4f}")


@pytest.mark.parametrize("name", ["kv-fp8", "kv-fp8-token", "kv-fp8e5m2", "kv-tq-k8v4"])
def test_fp8_hardware_and_bit_tricks_agree(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(3)
    a, table, lens, _, _ = filled(name, torch.bfloat16, g)
    q = torch.randn(len(LENS), H * G, D, generator=g).to(DEV, torch.bfloat16)
    out_hw = decode_attention(q, a, table, lens, max(LENS), scale=0.1)
    monkeypatch.setattr(triton_kv, "hw_fp8", lambda device: False)
    g = torch.Generator().manual_seed(3)
    b, _, _, _, _ = filled(name, torch.bfloat16, g)
    for plane, want in a.planes.items():
        assert torch.equal(b.planes[plane].view(torch.uint8), want.view(torch.uint8)), plane
    out_bits = decode_attention(q, b, table, lens, max(LENS), scale=0.1)
    assert torch.equal(out_hw, out_bits)


@pytest.mark.parametrize("name", ["kv-fp8", "kv-int8-token", "kv-tq-4bit-nc", None])
def test_cuda_graph_write_and_decode(name: str | None) -> None:
    """One decode step (write the new token, attend) captured once and replayed with new tokens,
    queries and lengths: the grid depends on max_len only, the lengths are read on the device."""
    g = torch.Generator().manual_seed(4)
    B, cap = 3, 4096
    per = cap // BS
    pages = KVPages(scheme_of(name), B * per, BS, H, D, dtype=torch.bfloat16, device=DEV)
    table = torch.randperm(B * per, generator=g).view(B, per).int().to(DEV)
    lens0 = [1000, 7, 2500]
    hist_k = torch.randn(B, cap, H, D, generator=g).to(DEV, torch.bfloat16)
    hist_v = torch.randn(B, cap, H, D, generator=g).to(DEV, torch.bfloat16)
    t = torch.arange(cap, device=DEV)
    all_slots = table.long()[:, t // BS] * BS + t % BS
    for b, n in enumerate(lens0):
        pages.write(hist_k[b, :n], hist_v[b, :n], all_slots[b, :n])
    k_new = torch.zeros(B, H, D, device=DEV, dtype=torch.bfloat16)
    v_new = torch.zeros_like(k_new)
    q = torch.zeros(B, H * G, D, device=DEV, dtype=torch.bfloat16)
    slots = torch.zeros(B, dtype=torch.long, device=DEV)
    lens = torch.zeros(B, dtype=torch.int32, device=DEV)

    def step() -> torch.Tensor:
        write_kv(pages, k_new, v_new, slots)
        return decode_attention(q, pages, table, lens, cap, scale=D**-0.5)

    def feed(pos: list[int]) -> None:
        for b, p in enumerate(pos):
            k_new[b], v_new[b] = hist_k[b, p], hist_v[b, p]
            slots[b] = all_slots[b, p]
            lens[b] = p + 1
        q.copy_(torch.randn(B, H * G, D, generator=g).to(DEV, torch.bfloat16))

    feed(lens0)
    step()  # compiles, and makes TurboQuant's tables, outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for shift in (1, 2, 3):
        pos = [n + shift for n in lens0]
        feed(pos)
        graph.replay()
        torch.cuda.synchronize()
        kd, vd = dequantized(pages, table, max(pos) + 1)
        ref = oracle(q, kd, vd, lens, scale=D**-0.5)
        assert rel(out.float(), ref) <= TOL[torch.bfloat16], shift
        eager = decode_attention(q, pages, table, lens, cap, scale=D**-0.5)
        assert torch.equal(out, eager)
