"""The lane-order repack of the CUDA tensor-core W4A16/W8A16 kernel, checked on the CPU.

The check decodes the packed bytes the way the kernel does (the bit extraction in
``kernels/wna16_mma.cu``) and places each value where PTX's mma.m16n8k16 B fragment says it
belongs (lane g = lane // 4, t = lane % 4: column g, inputs 2t, 2t+1 in b0 and 2t+8, 2t+9 in
b1), independently of the index table the repack uses. Then the group parameters, decoded the
way the kernel dequantizes, must give the reference's weights.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from quantrt import reference
from quantrt.backends.cuda.wna16_layout import KC, N_ALIGN, TG, group_params, repack_codes, unpack_codes
from quantrt.canonical import int_codes
from quantrt.reference.packing import pack_codes


def kernel_view(packed: torch.Tensor, bits: int) -> np.ndarray:
    """Dense codes [Npad, chunks*KC] as the kernel's mma sees them."""
    groups, chunks, tg = packed.shape[:3]
    # the kernel's address of tile T, chunk c: ((T / TG) * chunks + c) * TG + T % TG
    p = np.stack([packed[T // tg, :, T % tg].numpy() for T in range(groups * tg)])
    tiles = p.shape[0]
    kc = KC[bits]
    words = p.reshape(tiles, chunks, 32, 16).view("<u4").reshape(tiles, chunks, 32, 4)
    out = np.full((tiles * 8, chunks * kc), -1, dtype=np.int64)
    for lane in range(32):
        g, t = divmod(lane, 4)
        for kt in range(kc // 16):
            if bits == 4:
                w = words[:, :, lane, kt >> 1].astype(np.int64) >> (8 * (kt & 1))
                b0 = (w & 0xF, (w >> 16) & 0xF)  # (w & 0x000F000F): low half, high half
                b1 = ((w >> 4) & 0xF, (w >> 20) & 0xF)
            else:
                w = words[:, :, lane, kt].astype(np.int64)
                b0 = (w & 0xFF, (w >> 8) & 0xFF)  # prmt 0x4140: bytes 0 and 1
                b1 = ((w >> 16) & 0xFF, (w >> 24) & 0xFF)  # prmt 0x4342: bytes 2 and 3
            for reg, ks in ((b0, (2 * t, 2 * t + 1)), (b1, (2 * t + 8, 2 * t + 9))):
                for val, kk in zip(reg, ks):
                    cols = np.arange(chunks) * kc + kt * 16 + kk
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
    base = 1024.0 if act == torch.float16 else (128.0 if bits == 4 else float(1 << 23))
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
