"""The operands of ``cuda.mma_gguf`` and ``cuda.mma_gguf_q8`` (``backends/cuda/mma_gguf.py``)
checked without a GPU: an emulation of the kernels' decode (``Deq<T, Q4K>`` in
``kernels/wna16_common.cuh``: lane t of chunk c takes sub-block 4 (c % 2) + t, its scale and min
read from the column's 16 head bytes as the kernel reads them, one fused multiply-add per code in
the activation dtype; ``Deq<T, Q80>``: lane t's 16 bytes are one block's half, the signed code
times the block's d) on the repacked codes must give gguf-py's dequantized weights (llama.cpp's
reference, independent of this project) to the activation dtype's roundings, on random block
bytes (every code, every 6-bit scale and min, finite f16 fields of every size)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from quantrt.backends.cuda.mma_gguf import (
    CudaMmaGGUF,
    CudaMmaGGUFBlocks,
    CudaMmaGGUFQ8,
    high_word,
    q4k_operands,
    q8_operands,
)
from quantrt.backends.cuda.wna16_layout import TG, repack_codes
from quantrt.canonical import CanonicalWeight
from quantrt.capability import load_preset
from quantrt.reference.gguf import random_blocks
from quantrt.schemes import parse_scheme
from quantrt.specs import LayerSpec


def canon(N: int, K: int, seed: int, sane: bool = True, t: str = "q4_k") -> CanonicalWeight:
    return CanonicalWeight(
        parse_scheme(f"gguf-{t}"), N, K, {"qweight": random_blocks(t, N, K, seed=seed, sane=sane)}
    )


def llama(c: CanonicalWeight) -> torch.Tensor:
    q = c["qweight"].numpy()
    gt = GGMLQuantizationType[c.scheme.gguf_type.upper()]
    return torch.from_numpy(np.asarray(gguf_dequantize(q, gt), dtype=np.float64)).reshape(c.N, c.K)


def scale_min(heads: torch.Tensor, j: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's q4k_scale_min on head bytes [..., 16] for sub-blocks j: (d sc, dmin m) in fp32."""
    h = heads.to(torch.int64)
    i = (j & 3).unsqueeze(-1)
    y, z, w = (h[..., 4:8].gather(-1, i), h[..., 8:12].gather(-1, i), h[..., 12:16].gather(-1, i))
    lo = (j < 4).unsqueeze(-1)
    sc = torch.where(lo, y & 63, (w & 15) | ((y >> 6) << 4)).squeeze(-1)
    m = torch.where(lo, z & 63, (w >> 4) | ((z >> 6) << 4)).squeeze(-1)
    d = (h[..., 0] | h[..., 1] << 8).to(torch.int16).view(torch.float16).float()
    dmin = (h[..., 2] | h[..., 3] << 8).to(torch.int16).view(torch.float16).float()
    return d * sc.float(), dmin * m.float()


def kernel_view(packed: torch.Tensor, heads: torch.Tensor, act: torch.dtype) -> torch.Tensor:
    """Dense weights float64 [Npad, chunks*128] as the Q4K kernel's mma sees them: per lane (g, t),
    chunk c and k16 tile kt, word kt/2 shifted by 8 (kt % 2) gives the code pairs (4kt, 4kt+1) and
    (4kt+2, 4kt+3) (nibbles at bits 0 and 16, then 4 and 20), each fma(q, s, -o) rounded to act."""
    tiles, chunks = packed.shape[0] * TG, packed.shape[1]
    p = torch.stack([packed[T // TG, :, T % TG] for T in range(tiles)])  # [tiles, chunks, 32, 16]
    words = p.reshape(tiles, chunks, 32, 4, 4).to(torch.int64)
    words = words[..., 0] | words[..., 1] << 8 | words[..., 2] << 16 | words[..., 3] << 24
    out = torch.full((tiles * 8, chunks * 128), float("nan"), dtype=torch.float64)
    c = torch.arange(chunks)
    for lane in range(32):
        g, t = divmod(lane, 4)
        cols = torch.arange(tiles) * 8 + g
        hd = heads[(c // 2)[None, :], cols[:, None]]  # [tiles, chunks, 16]
        s, o = scale_min(hd, (4 * (c % 2) + t).expand(tiles, chunks))
        s = s.to(act).double()
        o = o.to(act).double()
        for kt in range(8):
            sh = words[:, :, lane, kt >> 1] >> (8 * (kt & 1))
            for kk, q in enumerate((sh & 0xF, (sh >> 16) & 0xF, (sh >> 4) & 0xF, (sh >> 20) & 0xF)):
                w = (q.double() * s - o).to(act).double()  # exact in float64, then one rounding
                out[cols[:, None], (c * 128 + t * 32 + 4 * kt + kk)[None, :]] = w
    return out


@pytest.mark.parametrize(
    ("act", "sane"), [(torch.bfloat16, True), (torch.float16, True), (torch.bfloat16, False)]
)
def test_emulated_decode_gives_llama_cpp_weights(act: torch.dtype, sane: bool) -> None:
    """N not a multiple of the 64-column padding, K of three super-blocks, random heads: the
    rounding bound holds per weight. Any finite f16 field (``sane`` False: subnormal to 65504) in
    bf16; fp16 activations need d sc and dmin m inside fp16's range, as any fp16 model does."""
    N, K = 70, 768
    c = canon(N, K, seed=5 if sane else 6, sane=sane)
    codes, heads = q4k_operands(c)
    got = kernel_view(repack_codes(codes, 4, N, K), heads, act)
    ref = llama(c)
    assert not got[:N, :K].isnan().any()
    # |d sc q - dmin m| rounded three times (s, o, the result) at the dtype's unit roundoff u
    nb = K // 256
    hd = heads[:nb, :N].unsqueeze(2).expand(nb, N, 8, 16)
    d_sc, dmin_m = (x.double() for x in scale_min(hd, torch.arange(8).expand(nb, N, 8)))
    span = (15 * d_sc.abs() + dmin_m.abs()).permute(1, 0, 2).reshape(N, -1).repeat_interleave(32, dim=1)
    u = 2.0 ** (-8 if act == torch.bfloat16 else -11)
    finite = torch.isfinite(ref) & torch.isfinite(span)
    err = (got[:N, :K] - ref).abs()
    assert bool((err[finite] <= 2 * u * span[finite] + 2.0**-24).all())
    if sane:
        assert bool(finite.all())
        assert float((got[:N, :K] - ref).norm() / ref.norm()) < u


def test_padding_is_zero_codes_and_zero_heads() -> None:
    N, K = 10, 256
    codes, heads = q4k_operands(canon(N, K, seed=1))
    assert heads.shape == (1, 64, 16) and heads.dtype == torch.uint8
    assert not heads[:, N:].any()
    w = kernel_view(repack_codes(codes, 4, N, K), heads, torch.float32)
    assert torch.equal(w[N:], torch.zeros_like(w[N:]))


def test_heads_are_the_stored_bytes() -> None:
    N, K = 3, 512
    c = canon(N, K, seed=2)
    _, heads = q4k_operands(c)
    blocks = c["qweight"].view(N, 2, 144)
    for n in range(N):
        for b in range(2):
            assert torch.equal(heads[b, n], blocks[n, b, :16])


def test_wrong_block_bytes_refused() -> None:
    c = canon(4, 512, seed=4)
    bad = CanonicalWeight(c.scheme, 4, 512, {"qweight": c["qweight"][:, :-1]})
    with pytest.raises(ValueError, match=r"expected uint8 \[4, 288\], found torch.uint8 \[4, 287\]"):
        q4k_operands(bad)


def test_launch_rows_keep_two_to_four_tiles() -> None:
    """16-byte heads per column: a warp's parameter copy is whole 32-lane pieces with 2 or 4 n8 tiles."""
    base = [{"max_m": 1, "mt": 1, "nt": 8, "swap": True}, {"max_m": 16, "mt": 1, "nt": 1}]
    assert [r["nt"] for r in CudaMmaGGUF().tile_rows({"small_m": base})] == [4, 2]
    own = [{"max_m": 1, "mt": 1, "nt": 2, "wn": 2, "swap": True}]
    assert CudaMmaGGUF().tile_rows({"small_m": base, "small_m_q4k": own}) == [own[0], {**base[1], "nt": 2}]


def bf16_bits(bits: torch.Tensor) -> torch.Tensor:
    return (bits - ((bits >> 15) << 16)).to(torch.int16).view(torch.bfloat16).double()


def test_q8_bf16_code_trick_on_every_byte() -> None:
    """``Q8Code<bf16>``: 128 + (u & 127) in 128's mantissa, less 256 (u < 128) or 128 (u >= 128),
    is u - 128 for every byte (the fp16 form, 1024 + u less 1152, is exact by fp16's 11 bits)."""
    u = torch.arange(256, dtype=torch.int64)
    v = bf16_bits((u & 0x7F) | 0x4300)
    c = bf16_bits((u & 0x80) ^ 0x4380)
    assert torch.equal(v - c, (u - 128).double())


def q8_view(packed: torch.Tensor, d: torch.Tensor, act: torch.dtype) -> torch.Tensor:
    """Dense weights float64 [Npad, chunks*64] as the Q80 kernel's mma sees them: lane (g, t) byte b
    of chunk c is input 64 c + 16 t + b of column g, block 2 c + t // 2; (u - 128) * d rounded."""
    tiles, chunks = packed.shape[0] * TG, packed.shape[1]
    p = torch.stack([packed[T // TG, :, T % TG] for T in range(tiles)]).to(
        torch.int64
    )  # [tiles, chunks, 32, 16]
    dv = d.view(torch.float16).float().to(act).double()  # [groups, Npad]
    out = torch.full((tiles * 8, chunks * 64), float("nan"), dtype=torch.float64)
    c = torch.arange(chunks)
    for lane in range(32):
        g, t = divmod(lane, 4)
        cols = torch.arange(tiles) * 8 + g
        s = dv[(2 * c + t // 2)[None, :], cols[:, None]]  # [tiles, chunks]
        for b in range(16):
            w = ((p[:, :, lane, b] - 128).double() * s).to(act).double()
            out[cols[:, None], (c * 64 + t * 16 + b)[None, :]] = w
    return out


@pytest.mark.parametrize(
    ("act", "sane"), [(torch.bfloat16, True), (torch.float16, True), (torch.bfloat16, False)]
)
def test_q8_emulated_decode_gives_llama_cpp_weights(act: torch.dtype, sane: bool) -> None:
    """K of 23 blocks (the last chunk half padding), N not a multiple of 64."""
    N, K = 70, 32 * 23
    c = canon(N, K, seed=11, sane=sane, t="q8_0")
    codes, d = q8_operands(c)
    assert codes.shape == (N, K) and d.shape == (24, 128) and d.dtype == torch.int16
    got = q8_view(repack_codes(codes, 8, N, K), d, act)[:N, :K]
    ref = llama(c)
    u = 2.0 ** (-8 if act == torch.bfloat16 else -11)
    finite = torch.isfinite(ref)
    assert bool((((got - ref).abs() <= 2 * u * ref.abs() + 2.0**-24) | ~finite).all())
    if act == torch.float16:  # d is exact in fp16: one rounding of the product
        assert bool((((got - ref).abs() <= u * ref.abs() + 2.0**-25) | ~finite).all())


def test_q8_scales_are_the_stored_bits() -> None:
    N, K = 3, 96
    c = canon(N, K, seed=12, t="q8_0")
    codes, d = q8_operands(c)
    blocks = c["qweight"].view(N, 3, 34)
    assert torch.equal(d[:3, :N].t().contiguous().view(torch.uint8).reshape(N, 3, 2), blocks[:, :, :2])
    assert not d[3:].any() and not d[:, N:].any()
    assert torch.equal(codes.view(N, 3, 32), blocks[:, :, 2:] ^ 0x80)


def test_q8_launch_rows_are_its_own_else_int8s() -> None:
    base = [{"max_m": 1, "mt": 1, "nt": 4, "swap": True}]
    w8 = [{"max_m": 1, "mt": 1, "nt": 8, "wn": 2, "swap": True}]
    own = [{"max_m": 1, "mt": 1, "nt": 2, "wn": 4, "swap": True}]
    assert CudaMmaGGUFQ8().tile_rows({"small_m": base}) == base
    assert CudaMmaGGUFQ8().tile_rows({"small_m": base, "small_m_w8": w8}) == w8
    assert CudaMmaGGUFQ8().tile_rows({"small_m": base, "small_m_w8": w8, "small_m_q80": own}) == own
    top = {"max_m": 16, "mt": 1, "nt": 2, "wn": 2}
    assert CudaMmaGGUFQ8().tile_rows({"small_m": [*base, top], "small_m_q80": own}) == [*own, top]


@pytest.mark.parametrize(("kernel", "t", "K"), [(CudaMmaGGUF, "q4_k", 512), (CudaMmaGGUFQ8, "q8_0", 96)])
def test_each_kernel_hands_its_types_operands_to_the_shared_kernel(kernel: type, t: str, K: int) -> None:
    """``prepare`` (shared with the integer kernels) takes codes and parameters from ``operands``:
    the type's own, no column factor, no code book."""
    c = canon(5, K, seed=13, t=t)
    codes, params, col, book = kernel().operands(c, None, torch.bfloat16)
    want = (q4k_operands if t == "q4_k" else q8_operands)(c)
    assert torch.equal(codes, want[0]) and torch.equal(params, want[1]) and col is None and book is None


BLOCK32_TYPES = ("q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q5_k", "q6_k")


def f16_field(lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """fp16 from two byte planes (little-endian), as float64."""
    return (lo.to(torch.int64) | hi.to(torch.int64) << 8).to(torch.int16).view(torch.float16).double()


def word32(b: torch.Tensor) -> torch.Tensor:
    """Four little-endian bytes [..., 4] (int64) -> their u32."""
    return b[..., 0] | b[..., 1] << 8 | b[..., 2] << 16 | b[..., 3] << 24


def act_half(lo: torch.Tensor, hi: torch.Tensor, act: torch.dtype) -> torch.Tensor:
    """A half of the activation dtype from two byte planes, as float64."""
    v = lo | hi << 8
    return bf16_bits(v) if act == torch.bfloat16 else v.to(torch.int16).view(torch.float16).double()


def block32_view(packed: torch.Tensor, params: torch.Tensor, t: str, act: torch.dtype) -> torch.Tensor:
    """Dense weights float64 [Npad, chunks*128] as ``Deq<T, Q40..Q6K>`` gives them to the mma: lane
    (g, t) of chunk c holds run 4 c + t of column g; tile kt's nibble pairs as in kernel_view; the
    fifth bits of tile kt from the run's high-bit word h as ``high_bits`` shifts them (bits 4 and
    20 of h << (4 - kt) for inputs 4kt, 4kt+1, of h >> (kt + 4) for 4kt+2, 4kt+3), q6_k's sixth
    bits likewise one place up; then (q - 8 | 16 | 32) d or q s + o, one rounding to act after d
    (or s and o) in act."""
    tiles, chunks = packed.shape[0] * TG, packed.shape[1]
    p = torch.stack([packed[T // TG, :, T % TG] for T in range(tiles)])
    words = word32(p.reshape(tiles, chunks, 32, 4, 4).to(torch.int64))
    prm = params.to(torch.int64)  # [groups, Npad, P]
    out = torch.full((tiles * 8, chunks * 128), float("nan"), dtype=torch.float64)
    c = torch.arange(chunks)
    high = t in ("q5_0", "q5_1", "q5_k", "q6_k")
    for lane in range(32):
        g, lt = divmod(lane, 4)
        cols = torch.arange(tiles) * 8 + g
        f = prm[(4 * c + lt)[None, :], cols[:, None]]  # [tiles, chunks, P]
        h = word32(f) if high else torch.zeros_like(f[..., 0])
        h6 = word32(f[..., 4:8]) if t == "q6_k" else torch.zeros_like(h)
        y = f[..., 8:] if t == "q6_k" else f[..., 4:] if high else f
        o = None
        if t in ("q2_k", "q3_k"):  # per 16-input half of the run: scale (and offset) pairs
            s6 = [act_half(y[..., 0], y[..., 1], act), act_half(y[..., 2], y[..., 3], act)]
            if t == "q2_k":
                o6 = [act_half(y[..., 4], y[..., 5], act), act_half(y[..., 6], y[..., 7], act)]
        elif t == "q6_k":
            s6 = [act_half(y[..., 0], y[..., 1], act), act_half(y[..., 2], y[..., 3], act)]
        elif t == "q5_k":
            s, o = act_half(y[..., 0], y[..., 1], act), act_half(y[..., 2], y[..., 3], act)
        else:
            s = f16_field(y[..., 0], y[..., 1]).to(act).double()
            if t in ("q4_1", "q5_1"):
                o = f16_field(y[..., 2], y[..., 3]).to(act).double()
        for kt in range(8):
            sh = words[:, :, lane, kt >> 1] >> (8 * (kt & 1))
            m0 = (h << (4 - kt) if kt <= 4 else h >> (kt - 4)) & 0x00100010
            m1 = (h >> (kt + 4)) & 0x00100010
            m0 |= (h6 << (5 - kt) if kt <= 5 else h6 >> (kt - 5)) & 0x00200020
            m1 |= (h6 >> (kt + 3)) & 0x00200020
            nib = (sh & 0xF, (sh >> 16) & 0xF, (sh >> 4) & 0xF, (sh >> 20) & 0xF)
            hb = ((m0 >> 4) & 3, (m0 >> 20) & 3, (m1 >> 4) & 3, (m1 >> 20) & 3)
            for kk in range(4):
                q = (nib[kk] | hb[kk] << 4).double()
                if t == "q6_k":
                    w = ((q - 32) * s6[kt // 4]).to(act).double()
                elif t == "q3_k":
                    w = ((q - 4) * s6[kt // 4]).to(act).double()
                elif t == "q2_k":
                    w = (q * s6[kt // 4] + o6[kt // 4]).to(act).double()
                elif o is None:
                    w = ((q - (16 if high else 8)) * s).to(act).double()
                else:
                    w = (q * s + o).to(act).double()
                out[cols[:, None], (c * 128 + lt * 32 + 4 * kt + kk)[None, :]] = w
    return out


@pytest.mark.parametrize("t", BLOCK32_TYPES)
@pytest.mark.parametrize("act", [torch.bfloat16, torch.float16], ids=str)
def test_block32_emulated_decode_gives_llama_cpp_weights(t: str, act: torch.dtype) -> None:
    """K not a multiple of the 128-input chunk (21 blocks; q5_k, q6_k: 3 super-blocks), N not a multiple
    of 64: every weight within the dtype's roundings of gguf-py's, the padding zero."""
    N, K = 70, 768 if t.endswith("_k") else 32 * 21
    c = canon(N, K, seed=21 + len(t), t=t)
    codes, params = CudaMmaGGUFBlocks().operands(c, None, act)[:2]
    groups = -(-K // 128) * 4
    assert params.shape == (groups, 128, {"q4_0": 2, "q4_1": 4, "q3_k": 4, "q6_k": 16}.get(t, 8))
    assert not params[K // 32 :].any() and not params[:, N:].any()
    got = block32_view(repack_codes(codes, 4, N, K), params, t, act)
    ref = llama(c)
    u = 2.0 ** (-8 if act == torch.bfloat16 else -11)
    span = ref.abs().reshape(N, -1, 32).amax(-1, keepdim=True).expand(N, K // 32, 32).reshape(N, K)
    assert bool(((got[:N, :K] - ref).abs() <= 3 * u * span + 2.0**-24).all())
    assert float((got[:N, :K] - ref).norm() / ref.norm()) < u
    assert torch.equal(got[N:], torch.zeros_like(got[N:])) and not got[:N, K:].any()


def test_high_word_puts_each_input_where_the_decode_shifts_from() -> None:
    """One fifth bit at a time: the word from ``high_word`` decodes (by high_bits' shifts) to that
    input alone."""
    for e in range(32):
        bits = torch.zeros(32, dtype=torch.uint8)
        bits[e] = 1
        w = high_word(bits).to(torch.int64)
        h = int(w[0] | w[1] << 8 | w[2] << 16 | w[3] << 24)
        kt, j = divmod(e, 4)
        m0 = ((h << (4 - kt)) if kt <= 4 else (h >> (kt - 4))) & 0x00100010
        m1 = (h >> (kt + 4)) & 0x00100010
        got = [(m0 >> 4) & 1, (m0 >> 20) & 1, (m1 >> 4) & 1, (m1 >> 20) & 1]
        assert got == [int(i == j) for i in range(4)], e
        assert bin(h).count("1") == 1


def test_block32_kernel_takes_its_types_only() -> None:
    caps = load_preset("h200").default_device
    assert set(CudaMmaGGUFBlocks.CODES) == set(BLOCK32_TYPES)
    for t, K, ok in [
        ("q3_k", 512 + 32, False),
        ("q6_k", 512 + 32, False),
        ("q2_k", 512, True),
        ("q5_k", 512, True),
        ("q6_k", 768, True),
        ("q4_1", 544, True),
    ]:
        spec = LayerSpec(parse_scheme(f"gguf-{t}"), K, 64, act_dtype=torch.bfloat16)
        v = CudaMmaGGUFBlocks.can_implement(spec, caps)
        assert v.ok == ok, (t, K, v.reason)
    v = CudaMmaGGUFBlocks.can_implement(LayerSpec(parse_scheme("w4a16-int-g128-sym"), 512, 64), caps)
    assert "GGUF q4_0/q4_1/q5_0/q5_1/q2_k/q3_k/q5_k/q6_k weights" in v.reason


def test_code_numbers_are_the_kernels() -> None:
    """The CODE template arguments Python passes are the values of the kernel's enum, name by name."""
    import re
    from pathlib import Path

    from quantrt.backends.cuda import mma_wna16

    src = (Path(mma_wna16.__file__).parent / "kernels" / "wna16_common.cuh").read_text()
    body = re.search(r"enum : int \{([^}]*)\}", src).group(1)
    names, value = {}, None
    for item in (x.strip() for x in body.split(",")):
        name, _, v = item.partition("=")
        value = int(v) if v else value + 1
        names[name.strip()] = value
    assert len(names) == 14
    for name, value in names.items():
        assert getattr(mma_wna16, name) == value, name
