"""Integer weights: bit packing, the reference dequant and the RTN quantizer.

Expected values come from hand arithmetic, literal bit loops and float64 loops written here,
never from the code under test.
"""

from __future__ import annotations

import pytest
import torch

from quantrt import reference
from quantrt.canonical import CanonicalWeight
from quantrt.packing import pack_codes, pack_int32, unpack_codes, unpack_int32
from quantrt.reference import intq
from quantrt.schemes import Scheme, catalog, parse_scheme

_SCALE_DT = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


# -- literal transcriptions of the bit formulas --------------------------------------------------


def literal_pack_bytes(codes: list[list[int]], bits: int) -> torch.Tensor:
    """Row-wise little-endian bit stream: bit j of code k goes to stream bit bits*k + j."""
    rows = []
    for row in codes:
        out = [0] * (-(-len(row) * bits // 8))
        for k, c in enumerate(row):
            for j in range(bits):
                pos = bits * k + j
                out[pos // 8] |= ((c >> j) & 1) << (pos % 8)
        rows.append(out)
    return torch.tensor(rows, dtype=torch.uint8)


def literal_unpack_bytes(packed: torch.Tensor, bits: int, n: int) -> list[list[int]]:
    rows = []
    for row in packed.tolist():
        codes = []
        for k in range(n):
            c = 0
            for j in range(bits):
                pos = bits * k + j
                c |= ((row[pos // 8] >> (pos % 8)) & 1) << j
            codes.append(c)
        rows.append(codes)
    return rows


def lsb_first_unpack(packed: torch.Tensor, bits: int, axis: int) -> torch.Tensor:
    """formats.md §1.1, transcribed."""
    pf = 32 // bits
    mask = (1 << bits) - 1
    p = packed.to(torch.int64) & 0xFFFFFFFF
    parts = [(p >> (bits * j)) & mask for j in range(pf)]
    out = torch.stack(parts, dim=axis + 1)
    shape = list(packed.shape)
    shape[axis] *= pf
    return out.reshape(shape)


def bitstream_unpack(words: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """formats.md §1.2, transcribed (1-D over the packed axis)."""
    u = words.to(torch.int64) & 0xFFFFFFFF
    out = torch.empty(n, dtype=torch.int64)
    for e in range(n):
        start = bits * e
        w, off = divmod(start, 32)
        v = u[w] >> off
        if off + bits > 32:
            v |= u[w + 1] << (32 - off)
        out[e] = v & ((1 << bits) - 1)
    return out


def rand_codes(gen: torch.Generator, shape: tuple[int, ...], bits: int) -> torch.Tensor:
    return torch.randint(0, 1 << bits, shape, generator=gen, dtype=torch.int64)


def dequant_loop(q, s, z, gidx, K) -> torch.Tensor:
    """float64 ``(q - z[n, g]) * s[n, g]`` with explicit indexing, one element at a time."""
    N = len(q)
    out = torch.empty(N, K, dtype=torch.float64)
    for n in range(N):
        for k in range(K):
            g = gidx[k]
            out[n, k] = (q[n][k] - z[n][g]) * s[n][g]
    return out


# -- packing -------------------------------------------------------------------------------------


def test_pack_hand_examples() -> None:
    # 4-bit: low nibble holds the even code.
    assert pack_codes(torch.tensor([[1, 2, 15, 0]]), 4).tolist() == [[0x21, 0x0F]]
    # 3-bit: 5 | 3 << 3 | 7 << 6 | 0 << 9 | 1 << 12 = 0x11DD, the 2nd byte's bits 13..15 are padding.
    assert pack_codes(torch.tensor([[5, 3, 7, 0, 1]]), 3).tolist() == [[0xDD, 0x11]]
    assert unpack_codes(torch.tensor([[0xDD, 0x11]], dtype=torch.uint8), 3, 5).tolist() == [[5, 3, 7, 0, 1]]
    # 2-bit: code k at bits 2k.
    assert pack_codes(torch.tensor([[3, 0, 1, 2, 1]]), 2).tolist() == [[0b10010011, 0b01]]


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("K", [1, 7, 8, 13, 19, 32])
def test_pack_bytes_matches_literal_bits(gen: torch.Generator, bits: int, K: int) -> None:
    codes = rand_codes(gen, (3, K), bits)
    packed = pack_codes(codes, bits)
    assert packed.dtype == torch.uint8
    assert torch.equal(packed, literal_pack_bytes(codes.tolist(), bits))
    assert literal_unpack_bytes(packed, bits, K) == codes.tolist()
    assert unpack_codes(packed, bits, K).tolist() == codes.tolist()


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_pack_bytes_round_trip_wide(gen: torch.Generator, bits: int) -> None:
    codes = rand_codes(gen, (2, 5, 1001), bits)
    packed = pack_codes(codes, bits)
    assert packed.shape == (2, 5, -(-1001 * bits // 8))
    assert torch.equal(unpack_codes(packed, bits, 1001).long(), codes)


def test_pack_rejects_bad_codes() -> None:
    with pytest.raises(ValueError, match=r"4-bit codes must lie in \[0, 15\]"):
        pack_codes(torch.tensor([[16]]), 4)
    with pytest.raises(ValueError, match="need 2 packed bytes"):
        unpack_codes(torch.zeros(1, 1, dtype=torch.uint8), 3, 5)


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("dim", [0, 1])
def test_int32_lsb_first_matches_formula(gen: torch.Generator, bits: int, dim: int) -> None:
    pf = 32 // bits
    shape = (2 * pf, 3) if dim == 0 else (3, 2 * pf)
    codes = rand_codes(gen, shape, bits)
    words = pack_int32(codes, bits, dim)
    assert words.dtype == torch.int32
    # Literal: word w of the packed axis holds codes w*pf + j at bits [bits*j, bits*j + bits).
    expect = torch.zeros(words.shape, dtype=torch.int64)
    cm = codes if dim == 0 else codes.T
    em = expect if dim == 0 else expect.T
    for w in range(em.shape[0]):
        for c in range(em.shape[1]):
            em[w, c] = sum(int(cm[w * pf + j, c]) << (bits * j) for j in range(pf))
    assert torch.equal(words.to(torch.int64) & 0xFFFFFFFF, expect)
    assert torch.equal(lsb_first_unpack(words, bits, dim), codes)
    assert torch.equal(unpack_int32(words, bits, dim).long(), codes)


def test_int32_3bit_gptq_straddles() -> None:
    # §1.2: v10 straddles words 0/1 (bits 30-31 of w0, bit 0 of w1); v21 straddles 1/2.
    codes = torch.zeros(32, 1, dtype=torch.int64)
    codes[10, 0] = 0b101
    codes[21, 0] = 0b111
    words = pack_int32(codes, 3, 0)
    assert words[:, 0].tolist() == [1 << 30, 1 - (1 << 31), 0b11]


def test_int32_3bit_matches_bitstream(gen: torch.Generator) -> None:
    codes = rand_codes(gen, (4, 64), 3)  # 64 codes -> 6 words per row
    words = pack_int32(codes, 3, 1)
    assert words.shape == (4, 6)
    for r in range(4):
        assert torch.equal(bitstream_unpack(words[r], 3, 64), codes[r])
    assert torch.equal(unpack_int32(words, 3, 1, 64).long(), codes)
    assert torch.equal(unpack_int32(pack_int32(codes.T, 3, 0), 3, 0, 64).long().T, codes)


# -- dequant ---------------------------------------------------------------------------------------


def test_dequant_hand_asym_group_with_v1_zero() -> None:
    # codes [0, 15, 7, 8 | 3, 12, 0, 15], G=4, scales [0.5, 0.25], zeros [8, 16]: 16 = 2^4 is GPTQ v1's
    # stored 15 plus one. Packed by hand, low nibble first.
    qweight = torch.tensor([[0xF0, 0x87, 0xC3, 0xF0]], dtype=torch.uint8)
    w = CanonicalWeight(
        parse_scheme("w4a16-int-g4-asym"),
        1,
        8,
        {
            "qweight": qweight,
            "scales": torch.tensor([[0.5, 0.25]]),
            "zeros": torch.tensor([[8, 16]], dtype=torch.int16),
        },
    )
    expect = [[-4.0, 3.5, -0.5, 0.0, -3.25, -1.0, -4.0, -0.25]]
    assert intq.dequantize(w).tolist() == expect
    assert reference.dequantize(w).tolist() == expect


def test_dequant_hand_sym_extremes_and_negative_scale() -> None:
    # 4-bit symmetric, zero 8: codes 0 and 15 are the extremes -8 and +7. A negative scale
    # (auto-round writes them) simply flips the sign.
    qweight = torch.tensor([[0xF0, 0x18, 0x00, 0x00], [0xF0, 0x18, 0x00, 0x00]], dtype=torch.uint8)
    w = CanonicalWeight(
        parse_scheme("w4a16-int-ch-sym"),
        2,
        8,
        {"qweight": qweight, "scales": torch.tensor([[0.5], [-2.0]])},
    )
    assert intq.dequantize(w).tolist() == [
        [-4.0, 3.5, 0.0, -3.5, -4.0, -4.0, -4.0, -4.0],
        [16.0, -14.0, 0.0, 14.0, 16.0, 16.0, 16.0, 16.0],
    ]


def test_dequant_hand_3bit_odd_k() -> None:
    # K=5 codes [5, 3, 7, 0, 1] packed as 0xDD 0x11; symmetric zero 4, scale 2.
    w = CanonicalWeight(
        parse_scheme("w3a16-int-ch-sym"),
        1,
        5,
        {"qweight": torch.tensor([[0xDD, 0x11]], dtype=torch.uint8), "scales": torch.tensor([[2.0]])},
    )
    assert intq.dequantize(w).tolist() == [[2.0, -2.0, 6.0, -8.0, -6.0]]


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("sym", [True, False])
def test_dequant_group_matches_float64_loop(gen: torch.Generator, bits: int, sym: bool) -> None:
    N, K, G = 5, 48, 16
    q = rand_codes(gen, (N, K), bits)
    s = torch.rand(N, K // G, generator=gen) * 2 - 1
    z = rand_codes(gen, (N, K // G), bits) if not sym else torch.full((N, K // G), 1 << (bits - 1))
    if not sym:
        z[0, 0] = 1 << bits  # a GPTQ v1 zero of 2^b
    scheme = Scheme("int", bits, "group", group_size=G, symmetric=sym)
    tensors = {"qweight": literal_pack_bytes(q.tolist(), bits), "scales": s}
    if not sym:
        tensors["zeros"] = z.to(torch.int16)
    got = intq.dequantize(CanonicalWeight(scheme, N, K, tensors))
    gidx = [k // G for k in range(K)]
    expect = dequant_loop(q.tolist(), s.double().tolist(), z.tolist(), gidx, K)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), expect, rtol=1e-7, atol=1e-7)


def test_dequant_act_order_permuted_g_idx(gen: torch.Generator) -> None:
    N, K, G, bits = 4, 64, 16, 4
    perm = torch.randperm(K, generator=gen)
    g_idx = torch.empty(K, dtype=torch.int32)
    g_idx[perm] = (torch.arange(K) // G).to(torch.int32)
    q = rand_codes(gen, (N, K), bits)
    s = torch.rand(N, K // G, generator=gen) + 0.1
    z = rand_codes(gen, (N, K // G), bits)
    w = CanonicalWeight(
        parse_scheme("w4a16-int-g16-asym-actorder"),
        N,
        K,
        {
            "qweight": literal_pack_bytes(q.tolist(), bits),
            "scales": s,
            "zeros": z.to(torch.int16),
            "g_idx": g_idx,
        },
    )
    expect = dequant_loop(q.tolist(), s.double().tolist(), z.tolist(), g_idx.tolist(), K)
    torch.testing.assert_close(intq.dequantize(w).double(), expect, rtol=1e-7, atol=1e-7)


def test_dequant_tensor_three_slices(gen: torch.Generator) -> None:
    sizes = (3, 2, 4)
    N, K, bits = sum(sizes), 12, 8
    q = rand_codes(gen, (N, K), bits)
    s = torch.tensor([0.5, 2.0, 0.125])
    z = torch.tensor([100, 128, 256], dtype=torch.int16)
    w = CanonicalWeight(
        parse_scheme("w8a16-int-tensor-asym"),
        N,
        K,
        {"qweight": literal_pack_bytes(q.tolist(), bits), "scales": s, "zeros": z},
        sizes,
    )
    slice_of = [0] * 3 + [1] * 2 + [2] * 4
    expect = torch.tensor(
        [
            [(q[n, k].item() - z[slice_of[n]].item()) * s[slice_of[n]].item() for k in range(K)]
            for n in range(N)
        ],
        dtype=torch.float64,
    )
    assert torch.equal(intq.dequantize(w).double(), expect)


def test_dequant_row_parallel_act_order_slice(gen: torch.Generator) -> None:
    scheme = parse_scheme("w4a16-int-g128-asym-actorder")
    N, K = 8, 512
    full = reference.quantize(torch.randn(N, K, generator=gen), scheme)
    dq = reference.dequantize(full)
    q = unpack_codes(full["qweight"], 4, K)
    for k0, k1 in [(0, 256), (256, 512), (128, 384)]:
        part = CanonicalWeight(
            scheme,
            N,
            k1 - k0,
            {
                "qweight": pack_codes(q[:, k0:k1], 4),
                "scales": full["scales"],
                "zeros": full["zeros"],
                "g_idx": full["g_idx"][k0:k1],
            },
        )
        assert torch.equal(intq.dequantize(part), dq[:, k0:k1])


def test_dequant_shape_errors() -> None:
    scheme = parse_scheme("w4a16-int-g4-sym")
    good = {"qweight": torch.zeros(2, 4, dtype=torch.uint8), "scales": torch.ones(2, 2)}
    with pytest.raises(ValueError, match=r"qweight must be uint8 \[2, 4\]"):
        intq.dequantize(
            CanonicalWeight(scheme, 2, 8, {**good, "qweight": torch.zeros(2, 3, dtype=torch.uint8)})
        )
    with pytest.raises(ValueError, match=r"needs 2 scale columns, found 1"):
        intq.dequantize(CanonicalWeight(scheme, 2, 8, {**good, "scales": torch.ones(2, 1)}))
    with pytest.raises(ValueError, match="asymmetric weights need a zeros tensor"):
        intq.dequantize(CanonicalWeight(parse_scheme("w4a16-int-g4-asym"), 2, 8, good))


# -- RTN quantizer ---------------------------------------------------------------------------------


def expanded(t: torch.Tensor, scheme: Scheme, N: int, K: int, g_idx: torch.Tensor | None) -> torch.Tensor:
    if scheme.granularity == "channel":
        return t.expand(N, K)
    if scheme.granularity == "tensor":
        return t.reshape(1, 1).expand(N, K)
    gid = g_idx.long() if g_idx is not None else torch.arange(K) // scheme.group_size
    return t[:, gid]


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("sym", [True, False])
@pytest.mark.parametrize("sdt", ["fp16", "bf16", "fp32"])
def test_rtn_error_bound_and_code_range(gen: torch.Generator, bits: int, sym: bool, sdt: str) -> None:
    N, K, G = 6, 256, 64
    w = torch.randn(N, K, generator=gen) * torch.logspace(-3, 2, N)[:, None]
    scheme = Scheme("int", bits, "group", group_size=G, symmetric=sym, scale_dtype=sdt)
    t = intq.quantize(w, scheme, g_idx=None, output_sizes=(N,), calib=None)
    assert set(t) == ({"qweight", "scales"} if sym else {"qweight", "scales", "zeros"})
    s = t["scales"]
    assert s.dtype == torch.float32 and s.shape == (N, K // G)
    assert torch.equal(s.to(_SCALE_DT[sdt]).float(), s)  # exactly representable in the scale dtype
    q = torch.tensor(literal_unpack_bytes(t["qweight"], bits, K))
    wg = w.double().view(N, K // G, G)
    if sym:
        assert int(q.min()) >= 1 and int(q.max()) <= (1 << bits) - 1
        exact = wg.abs().amax(-1) / ((1 << (bits - 1)) - 1)
        z = torch.full((N, K // G), 1 << (bits - 1))
    else:
        z = t["zeros"]
        assert z.dtype == torch.int16 and int(z.min()) >= 0 and int(z.max()) <= (1 << bits) - 1
        exact = (wg.amax(-1).clamp(min=0) - wg.amin(-1).clamp(max=0)) / ((1 << bits) - 1)
    # Scales are rounded up: never below amax/qmax, and less than one step of the scale dtype above
    # (a relative step for normal values, the subnormal spacing tiny*eps below them).
    fi = torch.finfo(_SCALE_DT[sdt])
    assert bool((s.double() >= exact * (1 - 1e-7)).all())
    assert bool((s.double() <= exact * (1 + 2 * fi.eps) + fi.tiny * fi.eps).all())
    dq = (q.double() - z.double().repeat_interleave(G, 1)) * s.double().repeat_interleave(G, 1)
    assert torch.equal(intq.dequantize(CanonicalWeight(scheme, N, K, t)).double(), dq.float().double())
    err = (w.double() - dq).abs()
    assert bool((err <= s.double().repeat_interleave(G, 1) * (0.5 + 1e-5)).all())


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("sym", [True, False])
def test_rtn_exact_on_grid(gen: torch.Generator, bits: int, sym: bool) -> None:
    N, K, G = 4, 32, 8
    qmax = (1 << bits) - 1
    s = (torch.randint(1, 64, (N, K // G), generator=gen) / 64.0).repeat_interleave(G, 1)  # fp16-exact
    if sym:
        q = torch.randint(1, qmax + 1, (N, K), generator=gen)
        q[:, ::G] = 1  # every group reaches -(2^(b-1) - 1), so amax / qmax gives s back
        z = torch.full((N, K), 1 << (bits - 1))
    else:
        q = torch.randint(0, qmax + 1, (N, K), generator=gen)
        q[:, ::G], q[:, 1::G] = 0, qmax  # every group spans the full code range
        z = torch.randint(0, qmax + 1, (N, K // G), generator=gen).repeat_interleave(G, 1)
    w = ((q - z) * s).float()
    scheme = Scheme("int", bits, "group", group_size=G, symmetric=sym)
    cw = reference.quantize(w, scheme)
    assert torch.equal(cw["scales"], s[:, ::G])
    assert torch.equal(unpack_codes(cw["qweight"], bits, K).long(), q)
    assert torch.equal(reference.dequantize(cw), w)


def test_rtn_zero_and_constant_groups() -> None:
    w = torch.zeros(3, 8)
    w[1, 4:] = 0.75  # one constant positive group; row 0 and the other groups are all zero
    for text in ("w4a16-int-g4-sym", "w4a16-int-g4-asym"):
        cw = reference.quantize(w, text)
        assert bool(torch.isfinite(cw["scales"]).all())
        assert cw["scales"][0].tolist() == [1.0, 1.0]
        assert bool(((reference.dequantize(cw) - w).abs() <= cw["scales"].repeat_interleave(4, 1) / 2).all())
    cw = reference.quantize(w, "w4a16-int-g4-asym")  # range widened to [0, .75]: zero 0, .75 is code 15
    assert cw["zeros"].tolist() == [[0, 0], [0, 0], [0, 0]]
    assert unpack_codes(cw["qweight"], 4, 8)[1].tolist() == [0] * 4 + [15] * 4


def test_rtn_tensor_three_slices(gen: torch.Generator) -> None:
    sizes = (4, 2, 3)
    w = torch.cat([torch.randn(n, 16, generator=gen) * m for n, m in zip(sizes, (1.0, 10.0, 0.01))])
    cw = reference.quantize(w, "w8a8-int-tensor-sym-static", output_sizes=sizes, calib=torch.ones(2, 16))
    rows = torch.tensor([0] * 4 + [1] * 2 + [2] * 3)
    expect = torch.stack([w[rows == i].abs().max() / 127 for i in range(3)])
    assert cw["scales"].shape == (3,)
    torch.testing.assert_close(cw["scales"], expect, rtol=2**-10, atol=0)
    err = (reference.dequantize(cw) - w).abs()
    assert bool((err <= cw["scales"][rows][:, None] * 0.50001).all())


def test_rtn_awkward_shapes(gen: torch.Generator) -> None:
    w = torch.randn(1, 20, generator=gen)  # N=1, 3-bit row of 60 bits -> 8 bytes with padding
    cw = reference.quantize(w, "w3a16-int-ch-asym")
    assert cw["qweight"].shape == (1, 8) and cw["scales"].shape == (1, 1)
    assert bool(((reference.dequantize(cw) - w).abs() <= cw["scales"] * 0.50001).all())
    cw = reference.quantize(torch.randn(1, 24, generator=gen), "w3a16-int-g8-sym")
    assert cw["qweight"].shape == (1, 9)


def test_act_order_builds_norm_sorted_groups(gen: torch.Generator) -> None:
    N, K, G = 8, 256, 64
    w = torch.randn(N, K, generator=gen) * (torch.rand(K, generator=gen) + 0.1)
    cw = reference.quantize(w, "w4a16-int-g64-sym-actorder")
    g = cw["g_idx"]
    assert g.dtype == torch.int32 and g.shape == (K,)
    assert torch.bincount(g.long()).tolist() == [G] * (K // G)
    norms = w.double().norm(dim=0)
    for a in range(K // G - 1):  # every channel of group a outranks every channel of group a + 1
        assert norms[g == a].min() >= norms[g == a + 1].max()
    assert not torch.equal(g.long(), torch.arange(K) // G)
    expect = dequant_loop(
        unpack_codes(cw["qweight"], 4, K).long().tolist(),
        cw["scales"].double().tolist(),
        [[8] * (K // G)] * N,
        g.tolist(),
        K,
    )
    torch.testing.assert_close(reference.dequantize(cw).double(), expect, rtol=1e-7, atol=1e-7)
    assert bool(((reference.dequantize(cw) - w).abs() <= cw["scales"][:, g.long()] * 0.50001).all())


def test_act_order_uses_given_g_idx(gen: torch.Generator) -> None:
    N, K, G = 4, 64, 16
    w = torch.randn(N, K, generator=gen)
    g_idx = torch.randint(0, K // G, (K,), generator=gen, dtype=torch.int32)  # uneven groups are allowed
    cw = reference.quantize(w, "w4a16-int-g16-asym-actorder", g_idx=g_idx)
    assert torch.equal(cw["g_idx"], g_idx)
    for n in range(N):
        for grp in range(K // G):
            cols = w[n, g_idx == grp]
            if cols.numel():
                span = cols.max().clamp(min=0) - cols.min().clamp(max=0)
                assert cw["scales"][n, grp] >= span / 15 * (1 - 1e-6)
    assert bool(((reference.dequantize(cw) - w).abs() <= cw["scales"][:, g_idx.long()] * 0.50001).all())


def test_quantize_errors(gen: torch.Generator) -> None:
    w = torch.randn(4, 100, generator=gen)
    with pytest.raises(ValueError, match=r"K=100 is not divisible by the group size G=64"):
        reference.quantize(w, "w4a16-int-g64-sym")
    with pytest.raises(ValueError, match=r"2-D \[N, K\] weight"):
        intq.quantize(
            torch.randn(2, 3, 64),
            parse_scheme("w4a16-int-g64-sym"),
            g_idx=None,
            output_sizes=(2,),
            calib=None,
        )
    with pytest.raises(ValueError, match=r"2-D \[N, K\] weight"):
        reference.quantize(torch.randn(64), "w4a16-int-g64-sym")
    with pytest.raises(ValueError, match=r"g_idx values must lie in \[0, 1\], found \[0, 2\]"):
        reference.quantize(w[:, :64], "w4a16-int-g32-sym-actorder", g_idx=torch.arange(64) % 3)
    with pytest.raises(ValueError, match=r"g_idx must have shape \[64\]"):
        reference.quantize(w[:, :64], "w4a16-int-g32-sym-actorder", g_idx=torch.zeros(63, dtype=torch.int32))
    with pytest.raises(ValueError, match="no act-order"):
        reference.quantize(w[:, :64], "w4a16-int-g32-sym", g_idx=torch.zeros(64, dtype=torch.int32))
    with pytest.raises(ValueError, match="NaN or infinite"):
        reference.quantize(torch.full((2, 64), float("nan")), "w4a16-int-g32-sym")
    with pytest.raises(ValueError, match=r"output_sizes \(3, 3\) must be positive and add up to N=4"):
        reference.quantize(w, "w8a16-int-tensor-sym", output_sizes=(3, 3))


_BOUND = {8: 0.01, 4: 0.15, 3: 0.3, 2: 0.8}  # 2-bit symmetric has only 3 levels


@pytest.mark.parametrize("scheme", [s for s in catalog() if s.family == "int"], ids=str)
def test_catalog_int_schemes(gen: torch.Generator, rel_err, scheme: Scheme) -> None:
    N, K = 48, 256
    w = torch.randn(N, K, generator=gen)
    calib = torch.randn(8, K, generator=gen)
    cw = reference.quantize(w, scheme, calib=calib)
    dq = reference.dequantize(cw)
    assert dq.shape == (N, K) and dq.dtype == torch.float32
    assert rel_err(dq, w) < _BOUND[scheme.bits]
    s = expanded(cw["scales"], scheme, N, K, cw.get("g_idx"))
    assert bool(((dq - w).abs() <= s * 0.50001).all())
