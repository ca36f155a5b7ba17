"""The paged store and the torch kernels: what each scheme stores (bytes per token worked by hand),
quantize-on-write equal to the reference codec, and decode attention over ragged, paged, masked
sequences equal to the fp32 oracle over the dequantized cache. The error against attention over
the unquantized keys and values is printed per scheme (``-s``) and bounded loosely."""

from __future__ import annotations

import pytest
import torch

from quantrt.kv import KVPages, attention_reference, bytes_per_token, decode_attention
from quantrt.kv.pages import KVCacheError, encode
from quantrt.schemes import KV_CATALOG, parse_kv_scheme

SCHEMES = [None, *KV_CATALOG]
#: decode vs attention over the unquantized cache (random normal keys and values, D=64)
LOOSE = {None: 1e-5, "fp8": 0.06, "fp8e5m2": 0.12, "int8": 0.03, "tq": 0.35}


def _scheme(name: str | None):
    return None if name is None else parse_kv_scheme(name)


def test_bytes_per_token_by_hand() -> None:
    H, D = 8, 128
    want = {
        None: H * 2 * D * 2,  # bf16 keys and values
        "kv-fp8": H * 2 * D,
        "kv-int8-head": H * 2 * D,  # static scales are per layer, not per token
        "kv-int8-token": H * 2 * (D + 4),  # one fp32 scale per token and head, for K and for V
        "kv-int8-g32": H * 2 * (D + 4 * D // 32),
        "kv-tq-k8v4": H * (D + D // 2 + 4),  # fp8 keys; 4-bit values + fp16 scale and zero
        "kv-tq-4bit-nc": H * (D // 2 + 2 + D // 2 + 4),  # + the fp16 key norm
        "kv-tq-k3v4-nc": H * (3 * D // 8 + 2 + D // 2 + 4),
        "kv-tq-3bit-nc": H * (3 * D // 8 + 2 + 3 * D // 8 + 4),
    }
    for name, n in want.items():
        assert bytes_per_token(_scheme(name), H, D) == n, name


def _fill(scheme, B: int, T: int, H: int, D: int, bs: int, g: torch.Generator, dtype: torch.dtype):
    """Pages holding B ragged sequences under a random block table, and their raw K/V."""
    per = -(-T // bs)
    nb = B * per + 3
    pages = KVPages(scheme, nb, bs, H, D, dtype=dtype)
    table = torch.randperm(nb, generator=g)[: B * per].view(B, per).to(torch.int32)
    lens = torch.randint(1, T + 1, (B,), generator=g)
    lens[0] = 1
    k = (torch.randn(B, T, H, D, generator=g) * 2).to(dtype)
    v = torch.randn(B, T, H, D, generator=g).to(dtype)
    pos = torch.arange(T)
    slots = table.long()[:, pos // bs] * bs + pos % bs
    slots = torch.where(pos[None] < lens[:, None], slots, -1)  # past each length: skipped
    pages.write(k.flatten(0, 1), v.flatten(0, 1), slots.flatten())
    return pages, table, lens, k, v, slots


@pytest.mark.parametrize("name", SCHEMES)
def test_write_equals_reference_codec(name: str | None) -> None:
    g = torch.Generator().manual_seed(3)
    s = _scheme(name)
    pages, _, _, k, v, slots = _fill(s, 3, 40, 2, 64, 16, g, torch.float32)
    want = encode(s, k.flatten(0, 1), v.flatten(0, 1), pages.k_scale, pages.v_scale)
    keep = slots.flatten() >= 0
    for n, plane in pages.flat().items():
        got = plane.view(torch.uint8) if plane.element_size() == 1 else plane
        ref = want[n][keep].to(plane.dtype)
        ref = ref.view(torch.uint8) if ref.element_size() == 1 else ref
        assert torch.equal(got[slots.flatten()[keep]], ref), n
    if pages.static:  # calibrated on this first write
        assert pages.k_scale is not None and pages.v_scale is not None


@pytest.mark.parametrize("name", SCHEMES)
@pytest.mark.parametrize("D,G", [(64, 3), (128, 1)])
def test_decode_matches_oracle(name: str | None, D: int, G: int) -> None:
    g = torch.Generator().manual_seed(D + G)
    s = _scheme(name)
    B, T, H, bs = 4, 70, 2, 16
    pages, table, lens, k, v, _ = _fill(s, B, T, H, D, bs, g, torch.float32)
    q = torch.randn(B, H * G, D, generator=g)
    mask = torch.rand(B, T, generator=g) > 0.2
    sinks = torch.randn(H * G, generator=g)
    for kw in ({}, {"window": 9, "softcap": 5.0}, {"mask": mask, "sinks": sinks}):
        out = decode_attention(q, pages, table, lens.to(torch.int32), T, scale=D**-0.5, **kw)
        kd, vd = pages.read(table, T)
        ref_kw = {**kw, "mask": kw["mask"][:, None, :] if "mask" in kw else None}
        ref = attention_reference(q[:, :, None], kd, vd, scale=D**-0.5, q_pos=(lens - 1)[:, None], **ref_kw)
        assert out.shape == q.shape and out.dtype == q.dtype
        assert torch.allclose(out, ref[:, :, 0], atol=1e-5, rtol=1e-4), (name, kw)
        exact = attention_reference(
            q[:, :, None],
            k.transpose(1, 2),
            v.transpose(1, 2),
            scale=D**-0.5,
            q_pos=(lens - 1)[:, None],
            **ref_kw,
        )[:, :, 0]
        err = float((out - exact).norm() / exact.norm())
        key = "tq" if name and name.startswith("kv-tq") else (name or "").split("-")[1] if name else None
        print(f"{name}: decode rel err vs unquantized {err:.4f} {kw and list(kw)}")
        assert err < LOOSE[key], (name, err)


def test_oracle_matches_sdpa() -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(2, 4, 5, 32, generator=g),
        torch.randn(2, 2, 9, 32, generator=g),
        torch.randn(2, 2, 9, 32, generator=g),
    )
    mask = torch.ones(5, 9, dtype=torch.bool).tril(4)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    assert torch.allclose(attention_reference(q, k, v, scale=32**-0.5), want, atol=1e-6)


def test_chunked_decode_equals_one_chunk() -> None:
    from quantrt.kv.kernels import torch_decode_attention

    g = torch.Generator().manual_seed(5)
    pages, table, lens, *_ = _fill(parse_kv_scheme("kv-int8-token"), 2, 100, 2, 32, 8, g, torch.float32)
    q = torch.randn(2, 4, 32, generator=g)
    a = torch_decode_attention(q, pages, table, lens.int(), 100, scale=0.2, chunk=16)
    b = torch_decode_attention(q, pages, table, lens.int(), 100, scale=0.2, chunk=4096)
    assert torch.allclose(a, b, atol=1e-6)


def test_bad_caches_are_refused() -> None:
    with pytest.raises(KVCacheError, match="power-of-two"):
        KVPages(parse_kv_scheme("kv-tq-4bit-nc"), 4, 16, 2, 96)
    with pytest.raises(KVCacheError, match="multiple of the group size"):
        KVPages(parse_kv_scheme("kv-int8-g32"), 4, 16, 2, 80)
    with pytest.raises(KVCacheError, match="positive sizes"):
        KVPages(None, 0, 16, 2, 64)
    p = KVPages(parse_kv_scheme("kv-fp8-head"), 4, 16, 2, 64, k_scale=torch.ones(2), v_scale=torch.ones(2))
    with pytest.raises(KVCacheError, match="expected keys and values"):
        p.write(torch.randn(3, 4, 64), torch.randn(3, 4, 64), torch.arange(3))
    with pytest.raises(KVCacheError, match="must hold 2 value"):
        KVPages(parse_kv_scheme("kv-fp8-head"), 4, 16, 2, 64, k_scale=torch.ones(3))
    assert [n for n, _ in p.verdicts][-1] == "torch" and p.kernels.name in ("native", "torch")
    # a static cache not yet calibrated, written only to skipped slots: nothing stored, no scales yet
    q = KVPages(parse_kv_scheme("kv-fp8"), 4, 16, 2, 64)
    q.write(torch.randn(3, 2, 64), torch.randn(3, 2, 64), torch.full((3,), -1))
    assert q.k_scale is None and q.v_scale is None
