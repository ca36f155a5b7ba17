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

from quantrt.backends.cuda.mma_gguf import CudaMmaGGUF, CudaMmaGGUFQ8, q4k_operands, q8_operands
from quantrt.backends.cuda.wna16_layout import TG, repack_codes
from quantrt.canonical import CanonicalWeight
from quantrt.reference.gguf import random_blocks
from quantrt.schemes import parse_scheme


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
    assert CudaMmaGGUF().tile_rows({"small_m": base, "small_m_q4k": own}) == own


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


@pytest.mark.parametrize(("kernel", "t", "K"), [(CudaMmaGGUF, "q4_k", 512), (CudaMmaGGUFQ8, "q8_0", 96)])
def test_each_kernel_hands_its_types_operands_to_the_shared_kernel(kernel: type, t: str, K: int) -> None:
    """``prepare`` (shared with the integer kernels) takes codes and parameters from ``operands``:
    the type's own, no column factor, no code book."""
    c = canon(5, K, seed=13, t=t)
    codes, params, col, book = kernel().operands(c, None, torch.bfloat16)
    want = (q4k_operands if t == "q4_k" else q8_operands)(c)
    assert torch.equal(codes, want[0]) and torch.equal(params, want[1]) and col is None and book is None
