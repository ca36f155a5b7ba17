"""The CUDA C++ decode of 4-bit TurboQuant caches (``backends/cuda/kv_mma.py``,
``kernels/kv_tq_decode.cu``) on a real GPU, against ``attention_reference`` over the cache read
back by the torch codec: head_dim 64/128/256, GQA groups 1..8, page sizes that hold whole 16-token
steps (16, 32) and those that do not (8, 48: one block-table lookup per token), ragged lengths
(1, 15, 17, a page and a step off), int64 block tables, strided and misaligned queries, a window, a
softcap and sinks, one split (the output written directly) and up to 64 (merged by the combine);
warps walking 79 steps (the ring of loads wrapping many times);
and beside the portable Triton kernel on the same pages; every call forced onto the kernel (the
size rule off). What it cannot take (a mask, fp32 queries, more than 8 query heads per KV head,
a call under the size rule) goes to the Triton kernel."""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device (run by ci/gpu.sh)", allow_module_level=True)

from quantrt.backends.cuda import kv_mma
from quantrt.kv.kernels import TorchKV, decode_attention
from quantrt.kv.pages import KVPages
from quantrt.kv.reference import attention_reference
from quantrt.schemes import parse_kv_scheme

DEV = "cuda"
SCHEME = parse_kv_scheme("kv-tq-4bit-nc")
#: rel. Frobenius error against the oracle over the dequantized cache (fp16 operands throughout;
#: a bf16 output rounds to 8 bits)
TOL = {torch.bfloat16: 1.2e-2, torch.float16: 4e-3}


@pytest.fixture(autouse=True)
def every_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel for every call these tests make (small calls otherwise go to Triton's)."""
    monkeypatch.setattr(kv_mma, "MIN_TOKEN_HEADS", 0)


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref.double()).norm() / ref.double().norm())


def build(lens, H, D, bs, dtype, g, table_dtype=torch.int32):  # type: ignore[no-untyped-def]
    """(pages, block table, lengths, keys and values as the torch codec reads them back [B, H, T, D])."""
    B, T = len(lens), max(lens)
    per = -(-T // bs)
    pages = KVPages(SCHEME, B * per + 3, bs, H, D, dtype=dtype, device=DEV)
    assert pages.kernels.name == "cuda.mma", pages.verdicts
    table = torch.randperm(B * per + 3, generator=g)[: B * per].view(B, per).to(DEV, table_dtype)
    k = (torch.randn(B, T, H, D, generator=g) * 2).to(DEV, dtype)
    v = torch.randn(B, T, H, D, generator=g).to(DEV, dtype)
    t = torch.arange(T, device=DEV)
    len_t = torch.tensor(lens, dtype=torch.int32, device=DEV)
    slots = table.long()[:, t // bs] * bs + t % bs
    slots = torch.where(t[None, :] < len_t[:, None], slots, -1)
    pages.write(k.flatten(0, 1), v.flatten(0, 1), slots.flatten())
    return pages, table, len_t, *read_back(pages, table, T)


def read_back(pages: KVPages, table: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values [B, H, length, D] as the torch codec reads the pages (on the CPU, where
    its TurboQuant constants live), on the GPU again."""
    c = KVPages(
        SCHEME, pages.num_blocks, pages.block_size, pages.num_kv_heads, pages.head_dim, dtype=pages.dtype
    )
    c.kernels = TorchKV()
    for n, p in pages.planes.items():
        c.planes[n].copy_(p.cpu())
    k, v = c.read(table.cpu(), length)
    return k.to(DEV), v.to(DEV)


def oracle(q, k, v, lens, **kw):  # type: ignore[no-untyped-def]
    return attention_reference(
        q[:, :, None].float(), k.float(), v.float(), scale=kw["scale"], q_pos=(lens.long() - 1)[:, None],
        window=kw.get("window"), softcap=kw.get("softcap"), sinks=kw.get("sinks"),
    )[:, :, 0]  # fmt: skip


CASES = [
    # (lens, H, G, D, block size)
    ((1, 15, 17, 300), 2, 4, 128, 16),
    ((4000, 33), 2, 8, 128, 32),
    ((2049,), 1, 1, 64, 16),
    ((700, 129), 2, 3, 64, 8),
    ((513, 1000), 1, 4, 256, 16),
    ((999, 64), 2, 2, 128, 48),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"L{max(c[0])}-H{c[1]}-G{c[2]}-D{c[3]}-bs{c[4]}")
def test_decode_matches_oracle(case, dtype) -> None:  # type: ignore[no-untyped-def]
    lens, H, G, D, bs = case
    g = torch.Generator().manual_seed(sum(lens) + D)
    pages, table, len_t, kd, vd = build(lens, H, D, bs, dtype, g)
    T = max(lens)
    # queries: channels strided, rows 2 bytes off 16-byte alignment (both copied first), rows
    # strided but aligned (read in place)
    views = (lambda w: w[:, :, ::2], lambda w: w[:, :, 1 : D + 1], lambda w: w[:, :, D:])
    for i, opts in enumerate(({}, {"window": 200}, {"softcap": 20.0}, {"sinks": True})):
        kw = dict(scale=D**-0.5, **opts)
        if opts.get("sinks"):
            kw["sinks"] = torch.randn(H * G, generator=g).to(DEV)
        wide = torch.randn(len(lens), H * G, 2 * D, generator=g).to(DEV, dtype)
        q = views[i % 3](wide)
        out = decode_attention(q, pages, table, len_t, T, **kw)
        assert out.dtype == dtype and out.shape == q.shape
        err = rel(out.float(), oracle(q, kd, vd, len_t, **kw))
        assert err <= TOL[dtype], f"{opts}: {err:.2e}"


@pytest.mark.parametrize("batch", [1, 3, 64])
def test_splits_and_direct_agree_with_triton(batch: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Batch 1 splits the context up to 64 ways, batch 64 runs one split (written directly): both
    agree with the portable kernel on the same pages, int64 block tables included."""
    g = torch.Generator().manual_seed(batch)
    lens = [int(x) for x in torch.randint(1, 6000, (batch,), generator=g)]
    lens[0] = 6000
    pages, table, len_t, kd, vd = build(lens, 2, 128, 16, torch.bfloat16, g, torch.int64)
    q = torch.randn(batch, 8, 128, generator=g).to(DEV, torch.bfloat16)
    out = decode_attention(q, pages, table, len_t, 6000, scale=0.09)
    ref = oracle(q, kd, vd, len_t, scale=0.09)
    assert rel(out.float(), ref) <= TOL[torch.bfloat16]
    triton = pages.kernels.portable.decode(q, pages, table, len_t, 6000, scale=0.09)
    assert rel(out.float(), triton.float()) <= TOL[torch.bfloat16]


def test_long_walks_read_their_pages_ahead() -> None:
    """Batch 40 x 8 KV heads runs one split per sequence, so a warp walks up to 79 steps, its ring of
    loads wrapping around many times; pages of 32 slots hold two steps."""
    g = torch.Generator().manual_seed(40)
    lens = [int(x) for x in torch.randint(1, 5000, (40,), generator=g)]
    lens[0] = 5000
    pages, table, len_t, kd, vd = build(lens, 8, 128, 32, torch.bfloat16, g)
    q = torch.randn(40, 8, 128, generator=g).to(DEV, torch.bfloat16)
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    assert kv_mma.num_splits(40, 8, 5000, 128, sms) == 1
    out = decode_attention(q, pages, table, len_t, 5000, scale=0.09)
    assert rel(out.float(), oracle(q, kd, vd, len_t, scale=0.09)) <= TOL[torch.bfloat16]
    triton = pages.kernels.portable.decode(q, pages, table, len_t, 5000, scale=0.09)
    assert rel(out.float(), triton.float()) <= TOL[torch.bfloat16]


def test_what_it_cannot_take_goes_to_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    """A mask, fp32 queries, 16 query heads per KV head, and (the size rule back) a call too
    small for the kernel: the portable kernel's answers."""
    g = torch.Generator().manual_seed(7)
    lens = (500, 77)
    pages, table, len_t, kd, vd = build(lens, 1, 128, 16, torch.float16, g)
    mask = torch.rand(2, 512, generator=g).to(DEV) > 0.2
    for q, kw in (
        (torch.randn(2, 4, 128, generator=g).to(DEV, torch.float16), {"mask": mask}),
        (torch.randn(2, 4, 128, generator=g).to(DEV), {}),
        (torch.randn(2, 16, 128, generator=g).to(DEV, torch.float16), {}),
    ):
        out = decode_attention(q, pages, table, len_t, 500, scale=0.1, **kw)
        want = pages.kernels.portable.decode(q, pages, table, len_t, 500, scale=0.1, **kw)
        assert torch.equal(out, want)
        ref = attention_reference(
            q[:, :, None].float(), kd.float(), vd.float(), scale=0.1, q_pos=(len_t.long() - 1)[:, None],
            mask=None if "mask" not in kw else mask[:, None, :500],
        )[:, :, 0]  # fmt: skip
        assert rel(out.float(), ref) <= TOL[torch.float16]
    monkeypatch.setattr(kv_mma, "MIN_TOKEN_HEADS", 1 << 18)
    q = torch.randn(2, 4, 128, generator=g).to(DEV, torch.float16)
    out = decode_attention(q, pages, table, len_t, 500, scale=0.1)
    assert torch.equal(out, pages.kernels.portable.decode(q, pages, table, len_t, 500, scale=0.1))


def test_cuda_graph_replays_with_new_lengths() -> None:
    g = torch.Generator().manual_seed(9)
    lens = [3000, 40]
    pages, table, len_t, kd, vd = build(lens, 2, 128, 16, torch.bfloat16, g)
    q = torch.randn(2, 8, 128, generator=g).to(DEV, torch.bfloat16)
    lens_dev = len_t.clone()
    decode_attention(q, pages, table, lens_dev, 3000, scale=0.1)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = decode_attention(q, pages, table, lens_dev, 3000, scale=0.1)
    for new in ([2999, 17], [1, 40], [3000, 1]):
        lens_dev.copy_(torch.tensor(new, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        ref = oracle(q, kd, vd, lens_dev, scale=0.1)
        assert rel(out.float(), ref) <= TOL[torch.bfloat16], new
        assert torch.equal(out, decode_attention(q, pages, table, lens_dev, 3000, scale=0.1))
