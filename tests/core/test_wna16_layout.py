"""The lane-order repack of the CUDA tensor-core W4A16/W8A16 kernel, checked on the CPU.

The check decodes the packed bytes the way the kernel does (``Codes::raw`` in
``kernels/wna16_mma.cu``): lane (g, t) of n8 tile T, chunk c, holds column 8T + g, and in k16
tile kt its pair registers r0 and r1 carry inputs t*KC/4 + 4kt + (0, 1) and (2, 3), the same
inputs the kernel reads from x for that lane. It places every value there, independently of the
index table the repack uses. Then the group parameters, decoded the way the kernel dequantizes,
must give the reference's weights.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from quantrt import reference
from quantrt.backends.cuda.wna16_layout import (
    KC,
    N_ALIGN,
    TG,
    group_params,
    repack_codes,
    tile_major,
    unpack_codes,
    wgmma_x_order,
)
from quantrt.canonical import int_codes
from quantrt.packing import pack_codes


def kernel_view(packed: torch.Tensor, bits: int) -> np.ndarray:
    """Dense codes [Npad, chunks*KC] as the kernel's mma sees them."""
    groups, chunks, tg = packed.shape[:3]
    # the kernel's address of tile T, chunk c: ((T / TG) * chunks + c) * TG + T % TG
    p = np.stack([packed[T // tg, :, T % tg].numpy() for T in range(groups * tg)])
    tiles = p.shape[0]
    kc = KC[bits]
    run = kc // 4
    words = p.reshape(tiles, chunks, 32, 16).view("<u4").reshape(tiles, chunks, 32, 4)
    out = np.full((tiles * 8, chunks * kc), -1, dtype=np.int64)
    for lane in range(32):
        g, t = divmod(lane, 4)
        for kt in range(kc // 16):
            if bits == 4:
                w = words[:, :, lane, kt >> 1].astype(np.int64) >> (8 * (kt & 1))
                r0 = (w & 0xF, (w >> 16) & 0xF)  # (w & 0x000F000F): low half, high half
                r1 = ((w >> 4) & 0xF, (w >> 20) & 0xF)
            else:
                w = words[:, :, lane, kt].astype(np.int64)
                r0 = (w & 0xFF, (w >> 8) & 0xFF)  # prmt 0x4140: bytes 0 and 1
                r1 = ((w >> 16) & 0xFF, (w >> 24) & 0xFF)  # prmt 0x4342: bytes 2 and 3
            for reg, ks in ((r0, (0, 1)), (r1, (2, 3))):
                for val, kk in zip(reg, ks):
                    cols = np.arange(chunks) * kc + t * run + 4 * kt + kk
                    out[g::8][:, cols] = val
    return out


@pytest.mark.parametrize("bits,N,K", [(4, 77, 200), (4, 64, 256), (8, 33, 96), (8, 130, 640), (4, 8, 2)])
def test_kernel_reads_every_code_where_the_fragment_wants_it(bits: int, N: int, K: int) -> None:
    g = torch.Generator().manual_seed(N * K + bits)
    codes = torch.randint(0, 1 << bits, (N, K), generator=g, dtype=torch.uint8)
    codes[0] = (1 << bits) - 1  # the extreme codes everywhere on some rows
    codes[-1] = 0
    q = pack_codes(codes, bits)
    packed = repack_codes(q, bits, N, K)
    chunks = -(-K // KC[bits])
    assert packed.shape == (-(-N // N_ALIGN) * N_ALIGN // 8 // TG, chunks, TG, 32, 16)
    seen = kernel_view(packed, bits)
    assert (seen >= 0).all()  # every byte of every lane is read by some fragment slot
    assert np.array_equal(seen[:N, :K], codes.numpy().astype(np.int64))
    assert (seen[N:] == 0).all() and (seen[:, K:] == 0).all()  # padding holds code 0
    assert torch.equal(unpack_codes(packed, bits, N, K), codes)


def test_act_order_permutes_inputs_before_packing() -> None:
    g = torch.Generator().manual_seed(5)
    codes = torch.randint(0, 16, (16, 256), generator=g, dtype=torch.uint8)
    perm = torch.randperm(256, generator=g)
    packed = repack_codes(pack_codes(codes, 4), 4, 16, 256, perm)
    assert torch.equal(unpack_codes(packed, 4, 16, 256), codes[:, perm])


def dequant_like_kernel(canon, bits: int, act: torch.dtype) -> torch.Tensor:
    """(magic + code - zb) * s with zb and s read from the kernel's group table, in fp32."""
    N, K = canon.N, canon.K
    s = canon.scheme
    group = s.group_size if s.granularity == "group" else None
    gp = group_params(canon["scales"], canon.get("zeros"), bits, K, group, act)
    codes = int_codes(canon).to(torch.float32)
    base = 1024.0 if act == torch.float16 else (128.0 if bits == 4 else 128.0 + 2048.0)
    gid = torch.arange(K) // gp.group
    if gp.sz.dtype == torch.float32:  # bf16 8-bit: fp32 pairs (zb, s)
        zb, sc = gp.sz[..., 0], gp.sz[..., 1]
    else:  # int32 words: low half zb, high half s, in the activation dtype
        halves = gp.sz.view(act).view(*gp.sz.shape, 2).to(torch.float32)
        zb, sc = halves[..., 0], halves[..., 1]
    return (base + codes - zb[gid, :N].t()) * sc[gid, :N].t()


@pytest.mark.parametrize(
    "scheme",
    [
        "w4a16-int-g128-asym",
        "w4a16-int-g32-sym",
        "w4a16-int-ch-asym",
        "w8a16-int-ch-sym",
        "w8a16-int-g64-asym",
        "w4a16-int-g64-asym",
    ],
)
@pytest.mark.parametrize("act", [torch.float16, torch.bfloat16])
def test_group_table_dequantizes_like_the_reference(scheme: str, act: torch.dtype) -> None:
    g = torch.Generator().manual_seed(len(scheme))
    w = torch.randn(40, 384, generator=g) * 0.05
    canon = reference.quantize(w, scheme)
    bits = canon.scheme.bits
    want = reference.dequantize(canon)
    got = dequant_like_kernel(canon, bits, act)
    # the kernel applies scales rounded to the activation dtype; codes and zeros stay exact
    rounding = 2.0**-8 if act == torch.bfloat16 else 2.0**-11
    assert torch.allclose(got, want, rtol=rounding, atol=1e-7)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group", [None, 16, 32, 64, 128, 256, 512, 1024, 384, 48])
def test_chunk_to_group_mapping_matches_the_group_of_every_input(bits: int, group: int | None) -> None:
    """The kernel finds a chunk's group as c >> shift (whole-chunk groups) or c * GPC + q; both
    must name the group of every input the chunk holds, or the layer must be declined."""
    from quantrt.backends.cuda.mma_wna16 import chunk_shift, groups_per_chunk

    kc = KC[bits]
    gpc = groups_per_chunk(bits, group)
    if group is not None and group % kc == 0 and (group // kc) & (group // kc - 1):
        assert gpc == 0  # e.g. 384 = 3 chunks: declined (c >> shift cannot express it)
        return
    if group is not None and group % kc and (kc % group or group % 16):
        assert gpc == 0
        return
    assert gpc > 0
    for c in range(40):
        for k in range(c * kc, (c + 1) * kc, 4):
            want = 0 if group is None else k // group
            if gpc == 1:
                got = c >> chunk_shift(bits, group)
            else:
                got = c * gpc + (k - c * kc) // (kc // gpc)
            assert got == want, (c, k)


def halves(words: np.ndarray, act: torch.dtype) -> np.ndarray:
    """uint32 words -> float64 [..., 2]: (low half, high half) read as fp16/bf16."""
    h = np.stack((words & 0xFFFF, words >> 16), axis=-1).astype(np.uint16)
    if act == torch.bfloat16:
        return (h.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return h.view(np.float16).astype(np.float64)


def to_act(v: np.ndarray, act: torch.dtype) -> np.ndarray:
    return torch.from_numpy(v).to(act).to(torch.float64).numpy()


def folded_registers(word: np.ndarray, bits: int, act: torch.dtype, vt: int) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's folded code registers (folded_codes / Codes::raw in wna16_mma.cu) of tile vt."""
    magic = 0x64006400 if act == torch.float16 else 0x43004300
    if bits == 4 or act == torch.bfloat16:  # nibble pairs; bf16 8-bit reads a byte as two nibbles
        s = word >> (8 * (vt & 1))
        return (s & 0x000F000F) | magic, ((s >> 4) & 0x000F000F) | magic
    # fp16 8-bit: prmt 0x4140 / 0x4342 with 0x64 bytes
    r0 = (word & 0xFF) | 0x6400 | ((word & 0xFF00) << 8) | 0x64000000
    r1 = ((word >> 16) & 0xFF) | 0x6400 | ((word >> 8) & 0xFF0000) | 0x64000000
    return r0, r1


def folded_x_pairs(lo: np.ndarray, hi: np.ndarray, bits: int, act: torch.dtype, v: int):
    """x pairs feeding registers r0 and r1 (folded_x in wna16_mma.cu)."""
    if bits == 8 and act == torch.bfloat16:  # inputs (0, 2) or (1, 3): low nibbles x, high nibbles 16x
        p = np.array((lo[v], hi[v]))
        return p, 16.0 * p
    return lo, hi


@pytest.mark.parametrize(
    "scheme",
    [
        "w4a16-int-g128-asym",
        "w4a16-int-ch-sym",
        "w8a16-int-ch-sym",
        "w8a16-int-g128-asym",
        "w3a16-int-g128-sym",  # cuda.mma_w2w3: codes widened to nibbles, int4's kernel
        "w2a16-int-g128-asym",
    ],
)
@pytest.mark.parametrize("act", [torch.bfloat16, torch.float16])
def test_folded_arithmetic_equals_the_reference(scheme: str, act: torch.dtype) -> None:
    """Emulate the folded path from the repacked bytes: per lane and (virtual) k16 tile, build the
    code registers as the kernel does, multiply each half by the x half the mma pairs it with, sum
    in float64, then apply s * (sum - zb * sum x) per group. It must equal x @ dequant(W).T."""
    from quantrt.backends.cuda.mma_narrow import NARROW_BITS, narrow_operands

    g = torch.Generator().manual_seed(len(scheme) + (act == torch.bfloat16))
    N, K = 16, 512
    canon = reference.quantize(torch.randn(N, K, generator=g) * 0.05, scheme)
    bits = canon.scheme.bits
    group = canon.scheme.group_size if canon.scheme.granularity == "group" else None
    if bits in NARROW_BITS:  # the operands cuda.mma_w2w3 hands the int4 kernel
        codes, sz = narrow_operands(canon, group, act)[:2]
        bits = 4
    else:
        codes, sz = (
            canon["qweight"],
            group_params(canon["scales"], canon.get("zeros"), bits, K, group, act).sz,
        )
    kc, run = KC[bits], KC[bits] // 4
    packed = repack_codes(codes, bits, N, K)
    if sz.dtype == torch.float32:
        zb, sc = sz[..., 0].double().numpy(), sz[..., 1].double().numpy()
    else:
        zs = halves(sz.numpy().view(np.uint32), act)
        zb, sc = zs[..., 0], zs[..., 1]
    x = to_act(torch.randn(K, generator=g).double().numpy(), act)
    words = (
        tile_major(packed).numpy().reshape(-1, packed.shape[1], 32, 16).view("<u4")
    )  # [tile, chunk, lane, 4]
    vts = 2 if (bits == 8 and act == torch.bfloat16) else 1
    y = np.zeros(N)
    for c in range(packed.shape[1]):
        gi = 0 if group is None else c * kc // group
        for t in range(4):
            xr = x[c * kc + t * run : c * kc + (t + 1) * run]
            for col in range(N):
                lane_words = words[col // 8, c, 4 * (col % 8) + t]
                tmp = 0.0
                for kt in range(kc // 16):
                    lo, hi = xr[4 * kt : 4 * kt + 2], xr[4 * kt + 2 : 4 * kt + 4]
                    for v in range(vts):
                        vt = kt * vts + v
                        word = lane_words[vt >> 1] if vts == 2 or bits == 4 else lane_words[vt]
                        r0, r1 = folded_registers(np.array(word, dtype=np.uint32), bits, act, vt)
                        x0, x1 = folded_x_pairs(lo, hi, bits, act, v)
                        x0, x1 = to_act(np.asarray(x0), act), to_act(np.asarray(x1), act)
                        tmp += (halves(r0, act) * x0).sum() + (halves(r1, act) * x1).sum()
                y[col] += sc[gi, col] * (tmp - zb[gi, col] * xr.sum())
    want = (reference.dequantize(canon).double() @ torch.from_numpy(x)).numpy()
    # the only rounding is the activation-dtype scale and zero point the table stores
    assert np.allclose(y, want, rtol=2e-2, atol=1e-3 * np.abs(want).max()), np.abs(y - want).max()


@pytest.mark.parametrize("bits,K", [(4, 256), (4, 200), (8, 64), (8, 100)])
def test_wgmma_x_order_feeds_each_fragment_its_inputs(bits: int, K: int) -> None:
    """wgmma reads x at canonical k = 8h + 2t + e of each k16 tile (PTX fragment layout: a0/a1
    hold k 2t, 2t+1; a2/a3 hold 2t+8, 2t+9), while the repacked codes give lane t of tile kt the
    inputs t*KC/4 + 4kt + 2h + e (kernel_view above): the product over the reordered x must be
    x @ W.T with x zero past K."""
    g = torch.Generator().manual_seed(K)
    kc = KC[bits]
    chunks = -(-K // kc)
    N = 24
    codes = torch.randint(0, 1 << bits, (N, K), generator=g, dtype=torch.uint8)
    packed = repack_codes(pack_codes(codes, bits), bits, N, K, None)
    view = kernel_view(packed, bits)[:N]  # input index -> code, as the lanes hold them
    x = torch.randn(3, K, generator=g, dtype=torch.float64)
    xw = wgmma_x_order(x, bits, chunks)
    assert xw.shape == (3, chunks * kc)
    y = torch.zeros(3, N, dtype=torch.float64)
    for c in range(chunks):
        for kt in range(kc // 16):
            for j in range(16):  # canonical k of the tile
                h, rem = divmod(j, 8)
                t, e = divmod(rem, 2)
                k = c * kc + t * (kc // 4) + 4 * kt + 2 * h + e  # the input lane t's register holds there
                w = torch.from_numpy(view[:, k]).double()  # past K: padding codes, times x = 0
                y += xw[:, c * kc + kt * 16 + j, None] * w[None, :]
    assert torch.allclose(y, x @ codes.double().T)


def test_swapped_rows_per_block_below_the_bucket() -> None:
    """A tuning row past 64 rows keeps a swapped 64-row tile and launches more row blocks; rows
    per block that the swapped kernel cannot hold are refused at load."""
    from quantrt.backends.cuda.mma_wna16 import Shape

    row = {"max_m": 256, "mt": 1, "nt": 2, "wn": 4, "swap": True, "xr": 64, "stages": 3, "fold": False}
    sh = Shape.of(row, 4, torch.bfloat16, 1)
    assert (sh.swap, sh.xr, sh.rows, sh.mt) == (True, 64, 64, 1)
    plain = Shape.of({k: v for k, v in row.items() if k != "xr"}, 4, torch.bfloat16, 1)
    assert (plain.swap, plain.rows) == (False, 16)  # past 64 rows without xr: the unswapped tiles
    for bad in (12, 72, -8):
        with pytest.raises(ValueError, match="rows per block"):
            Shape.of(row | {"xr": bad}, 4, torch.bfloat16, 1)
