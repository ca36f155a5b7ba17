"""GGUF reference: llama.cpp's native blocks, decoded and written in pure torch.

Types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and the K-quants Q2_K, Q3_K, Q4_K, Q5_K, Q6_K. A row of K
weights is ``K / B`` blocks of ``T`` bytes each (:data:`BLOCK`); rows are independent.

Dequantization equals llama.cpp's reference dequantizers (``gguf.quants.dequantize``) bit for bit
in fp32. Every product of an f16 scale, an integer sub-block scale and an integer code is exact
in fp32 except Q6_K's, which rounds once whichever way it is associated; so the only rounding
that order could change is the final ``+ m`` / ``- dmin * m``, done last here as in llama.cpp.
Bytes are reinterpreted with ``Tensor.view`` (little-endian host, as GGUF's default order).

Quantization is round-to-nearest. The five legacy types reproduce llama.cpp's
``quantize_row_*_ref`` (the bytes ``gguf.quants.quantize`` writes), including its operation
order (``1/d`` from the unrounded fp32 ``d``, ``trunc(x * id + 8.5)`` ...). The K-quants use
plain min/max (Q2_K, Q4_K, Q5_K) or signed absmax (Q3_K, Q6_K) per sub-block, quantize the
sub-block scales and mins against an f16 super-block ``d`` / ``dmin``, then round the codes
against the quantized scales; this is not llama.cpp's iterative search, only valid blocks.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..canonical import CanonicalWeight
from ..errors import ReferenceInputError
from ..gguf_blocks import f16_field, k_scale_min, q3_k_scales
from ..schemes import GGUF_TYPES, Scheme

#: type -> (elements per block, bytes per block)
BLOCK: dict[str, tuple[int, int]] = {t: (b, n) for t, (b, n, _) in GGUF_TYPES.items()}


#: byte offsets of each type's f16 fields (d, and m / dmin where present) inside a block
F16_FIELDS: dict[str, tuple[int, ...]] = {
    "q4_0": (0,),
    "q4_1": (0, 2),
    "q5_0": (0,),
    "q5_1": (0, 2),
    "q8_0": (0,),
    "q2_k": (80, 82),
    "q3_k": (108,),
    "q4_k": (0, 2),
    "q5_k": (0, 2),
    "q6_k": (208,),
}


#: byte range (offset, size) of each K-quant's sub-block scales inside a block
SCALE_FIELDS: dict[str, tuple[int, int]] = {
    "q2_k": (0, 16),
    "q3_k": (96, 12),
    "q4_k": (4, 12),
    "q5_k": (4, 12),
    "q6_k": (192, 16),
}


def random_blocks(
    gguf_type: str, N: int, K: int, seed: int, *, sane: bool = True, fill: int | None = None
) -> torch.Tensor:
    """uint8 [N, K/B*T] blocks for tests and benchmarks: random code bytes (or all ``fill``), and
    every f16 field a random finite half: weight-like normal draws (``sane``, so products stay in
    fp16's range) or any finite bit pattern, subnormals up to +-65504."""
    B, T = BLOCK[gguf_type]
    g = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (N, K // B, T), dtype=torch.uint8, generator=g)
    if fill is not None:
        blocks.fill_(fill)
    for off in F16_FIELDS[gguf_type]:
        if sane:
            bits = (torch.randn(N, K // B, generator=g) * 2.0**-7).half().view(torch.int16)
        else:
            bits = torch.randint(0, 1 << 16, (N, K // B), dtype=torch.int32, generator=g)
            bits = torch.where((bits & 0x7C00) == 0x7C00, bits & ~0x0400, bits)  # Inf/NaN -> finite
            bits = (bits - ((bits >> 15) << 16)).to(torch.int16)
        blocks[..., off : off + 2] = bits.contiguous().view(torch.uint8).reshape(N, K // B, 2)
    return blocks.reshape(N, -1)


class GGUFBlockError(ReferenceInputError):
    """Shapes, byte counts or values that do not make valid GGUF blocks."""


# -- byte helpers ------------------------------------------------------------------------------


def _f16_bytes(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` [M, 1] rounded to f16: the rounded value in fp32 and its two bytes [M, 2]."""
    h = x.to(torch.float16).contiguous()
    return h.to(torch.float32), h.view(torch.uint8)


def _shifts(bits: int, count: int, device: torch.device) -> torch.Tensor:
    return (torch.arange(count, device=device, dtype=torch.uint8) * bits).view(count, 1)


def _unpack(x: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """[M, G, L] bytes -> [M, G, count, L]: field j of each byte (bits ``[bits*j, bits*j+bits)``)."""
    return (x.unsqueeze(-2) >> _shifts(bits, count, x.device)) & ((1 << bits) - 1)


def _pack(q: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of :func:`_unpack`: [M, G, count, L] fields -> [M, G * L] bytes."""
    out = (q.to(torch.uint8) << _shifts(bits, q.shape[-2], q.device)).sum(-2, dtype=torch.int32)
    return out.to(torch.uint8).reshape(q.shape[0], -1)


def _signed_absmax(x: torch.Tensor) -> torch.Tensor:
    """The element of largest magnitude along the last dim, with its sign (first one on ties)."""
    return x.gather(-1, x.abs().argmax(-1, keepdim=True))


def _recip(d: torch.Tensor) -> torch.Tensor:
    """``1/d``, 0 where ``d == 0`` (llama.cpp's ``id = d ? 1.0f/d : 0.0f``)."""
    return torch.where(d == 0, torch.zeros_like(d), 1.0 / d)


def _safe_div(x: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """``x / d``, 0 where ``d == 0`` (an all-zero or collapsed scale gives code 0)."""
    return torch.where(d == 0, torch.zeros_like(x), x / torch.where(d == 0, torch.ones_like(d), d))


# -- dequantizers: uint8 [M, T] -> fp32 [M, B] ---------------------------------------------------


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """16 bytes per block -> 32 codes: first half in low nibbles, second half in high nibbles."""
    return _unpack(qs.reshape(-1, 1, 16), 4, 2).reshape(-1, 32)


def _qh32(qh: torch.Tensor) -> torch.Tensor:
    """4 bytes (a little-endian u32) -> 32 bits, bit e for element e."""
    return _unpack(qh.reshape(-1, 4, 1), 1, 8).reshape(-1, 32)


def _deq_q4_0(b: torch.Tensor) -> torch.Tensor:
    return f16_field(b, 0) * (_nibbles(b[:, 2:18]).to(torch.int16) - 8).to(torch.float32)


def _deq_q4_1(b: torch.Tensor) -> torch.Tensor:
    return f16_field(b, 0) * _nibbles(b[:, 4:20]).to(torch.float32) + f16_field(b, 2)


def _deq_q5_0(b: torch.Tensor) -> torch.Tensor:
    q = _nibbles(b[:, 6:22]) | (_qh32(b[:, 2:6]) << 4)
    return f16_field(b, 0) * (q.to(torch.int16) - 16).to(torch.float32)


def _deq_q5_1(b: torch.Tensor) -> torch.Tensor:
    q = _nibbles(b[:, 8:24]) | (_qh32(b[:, 4:8]) << 4)
    return f16_field(b, 0) * q.to(torch.float32) + f16_field(b, 2)


def _deq_q8_0(b: torch.Tensor) -> torch.Tensor:
    return b[:, 2:34].contiguous().view(torch.int8).to(torch.float32) * f16_field(b, 0)


def _deq_q2_k(b: torch.Tensor) -> torch.Tensor:
    sc = b[:, :16]
    dl = f16_field(b, 80) * (sc & 0xF).to(torch.float32)
    ml = f16_field(b, 82) * (sc >> 4).to(torch.float32)
    q = _unpack(b[:, 16:80].reshape(-1, 2, 32), 2, 4).reshape(-1, 16, 16).to(torch.float32)
    return (dl.unsqueeze(-1) * q - ml.unsqueeze(-1)).reshape(-1, 256)


def _deq_q3_k(b: torch.Tensor) -> torch.Tensor:
    dl = f16_field(b, 108) * q3_k_scales(b[:, 96:108]).to(torch.float32)
    low = _unpack(b[:, 32:96].reshape(-1, 2, 32), 2, 4).reshape(-1, 16, 16).to(torch.int16)
    hbit = _unpack(b[:, :32].reshape(-1, 1, 32), 1, 8).reshape(-1, 16, 16).to(torch.int16)
    q = (low - 4 * (1 - hbit)).to(torch.float32)
    return (dl.unsqueeze(-1) * q).reshape(-1, 256)


def _deq_k_asym(b: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Q4_K/Q5_K: ``d * sc * q - dmin * m`` per 32-element sub-block, q [M, 8, 32]."""
    sc, mn = k_scale_min(b[:, 4:16])
    dl = f16_field(b, 0) * sc.to(torch.float32)
    ml = f16_field(b, 2) * mn.to(torch.float32)
    return (dl.unsqueeze(-1) * q.to(torch.float32) - ml.unsqueeze(-1)).reshape(-1, 256)


def _deq_q4_k(b: torch.Tensor) -> torch.Tensor:
    return _deq_k_asym(b, _unpack(b[:, 16:144].reshape(-1, 4, 32), 4, 2).reshape(-1, 8, 32))


def _deq_q5_k(b: torch.Tensor) -> torch.Tensor:
    low = _unpack(b[:, 48:176].reshape(-1, 4, 32), 4, 2).reshape(-1, 8, 32)
    high = _unpack(b[:, 16:48].reshape(-1, 1, 32), 1, 8).reshape(-1, 8, 32)
    return _deq_k_asym(b, low | (high << 4))


def _deq_q6_k(b: torch.Tensor) -> torch.Tensor:
    low = _unpack(b[:, :128].reshape(-1, 2, 64), 4, 2).reshape(-1, 256)
    high = _unpack(b[:, 128:192].reshape(-1, 2, 32), 2, 4).reshape(-1, 256)
    q = ((low | (high << 4)).to(torch.int16) - 32).to(torch.float32).reshape(-1, 16, 16)
    dl = f16_field(b, 208) * b[:, 192:208].contiguous().view(torch.int8).to(torch.float32)
    return (dl.unsqueeze(-1) * q).reshape(-1, 256)


# -- legacy quantizers: fp32 [M, B] -> uint8 [M, T], byte-identical to llama.cpp's ref ------------


def _q_sym_legacy(x: torch.Tensor, half: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_0/Q5_0: ``d = max / -half`` with the signed max-magnitude element; codes ``0..2*half-1``."""
    d = _signed_absmax(x) / -half
    q = torch.trunc(x * _recip(d) + (half + 0.5)).clamp(0, 2 * half - 1).to(torch.uint8)
    return d, q


def _q_asym_legacy(x: torch.Tensor, top: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_1/Q5_1: ``d = (max - min) / top``, codes ``trunc((x - min) / d + 0.5)``."""
    lo = x.amin(-1, keepdim=True)
    d = (x.amax(-1, keepdim=True) - lo) / top
    q = torch.trunc((x - lo) * _recip(d) + 0.5).clamp(0, top).to(torch.uint8)
    return d, lo, q


def _pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    return (q[:, :16] & 0xF) | (q[:, 16:] << 4)


def _pack_qh32(q: torch.Tensor) -> torch.Tensor:
    return _pack((q >> 4).reshape(-1, 4, 8, 1), 1)


def _quant_q4_0(x: torch.Tensor) -> torch.Tensor:
    d, q = _q_sym_legacy(x, 8)
    return torch.cat([_f16_bytes(d)[1], _pack_nibbles(q)], dim=-1)


def _quant_q5_0(x: torch.Tensor) -> torch.Tensor:
    d, q = _q_sym_legacy(x, 16)
    return torch.cat([_f16_bytes(d)[1], _pack_qh32(q), _pack_nibbles(q)], dim=-1)


def _quant_q4_1(x: torch.Tensor) -> torch.Tensor:
    d, lo, q = _q_asym_legacy(x, 15)
    return torch.cat([_f16_bytes(d)[1], _f16_bytes(lo)[1], _pack_nibbles(q)], dim=-1)


def _quant_q5_1(x: torch.Tensor) -> torch.Tensor:
    d, lo, q = _q_asym_legacy(x, 31)
    return torch.cat([_f16_bytes(d)[1], _f16_bytes(lo)[1], _pack_qh32(q), _pack_nibbles(q)], dim=-1)


def _quant_q8_0(x: torch.Tensor) -> torch.Tensor:
    d = x.abs().amax(-1, keepdim=True) / 127
    v = x * _recip(d)
    a = v.abs()
    fl = torch.floor(a)
    q = torch.sign(v) * (fl + torch.floor(2 * (a - fl)))  # roundf: half away from zero, gguf's order
    return torch.cat([_f16_bytes(d)[1], q.to(torch.int8).view(torch.uint8)], dim=-1)


# -- K-quant round-to-nearest quantizers ----------------------------------------------------------


def _minmax_subblocks(xs: torch.Tensor, top: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sub-block step ``(max - min) / top`` and offset ``-min`` with ``min <= 0`` (as llama.cpp)."""
    lo = xs.amin(-1).clamp(max=0)
    return (xs.amax(-1) - lo) / top, -lo


def _code_scales(s: torch.Tensor, top: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Non-negative sub-block scales [M, S] -> f16 super scale bytes, codes ``0..top``, and
    the quantized scales ``d16 * code`` in fp32."""
    d16, dbytes = _f16_bytes(s.amax(-1, keepdim=True) / top)
    code = torch.round(_safe_div(s, d16)).clamp(0, top)
    return dbytes, code.to(torch.uint8), d16 * code


def _code_signed_scales(s: torch.Tensor, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Signed sub-block scales [M, S] -> f16 super scale (``max / lo``, so the largest maps to
    ``lo``) bytes, codes ``lo..hi`` and quantized scales."""
    d16, dbytes = _f16_bytes(_signed_absmax(s) / lo)
    code = torch.round(_safe_div(s, d16)).clamp(lo, hi)
    return dbytes, code.to(torch.int16), d16 * code


def _asym_codes(xs: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, top: int) -> torch.Tensor:
    return (
        torch.round(_safe_div(xs + offset.unsqueeze(-1), scale.unsqueeze(-1))).clamp(0, top).to(torch.uint8)
    )


def _quant_q2_k(x: torch.Tensor) -> torch.Tensor:
    xs = x.reshape(-1, 16, 16)
    s, mn = _minmax_subblocks(xs, 3)
    dbytes, sc, s_q = _code_scales(s, 15)
    mbytes, mc, m_q = _code_scales(mn, 15)
    q = _asym_codes(xs, s_q, m_q, 3)
    qs = _pack(q.reshape(-1, 2, 4, 32), 2)
    return torch.cat([sc | (mc << 4), qs, dbytes, mbytes], dim=-1)


def _quant_q3_k(x: torch.Tensor) -> torch.Tensor:
    xs = x.reshape(-1, 16, 16)
    dbytes, sc, s_q = _code_signed_scales(_signed_absmax(xs).squeeze(-1) / -4, -32, 31)
    q = torch.round(_safe_div(xs, s_q.unsqueeze(-1))).clamp(-4, 3).to(torch.int16) + 4
    hmask = _pack((q >> 2).reshape(-1, 1, 8, 32), 1)
    qs = _pack((q & 3).reshape(-1, 2, 4, 32), 2)
    code = (sc + 32).to(torch.uint8)
    low = (code[:, :8] & 0xF) | ((code[:, 8:] & 0xF) << 4)
    high = _pack((code >> 4).reshape(-1, 1, 4, 4), 2)
    return torch.cat([hmask, qs, low, high, dbytes], dim=-1)


def _k_scale_bytes(sc: torch.Tensor, mn: torch.Tensor) -> torch.Tensor:
    """Q4_K/Q5_K: 8 six-bit scales and mins -> 12 bytes (inverse of :func:`k_scale_min`)."""
    return torch.cat(
        [
            (sc[:, :4] & 0x3F) | ((sc[:, 4:] >> 4) << 6),
            (mn[:, :4] & 0x3F) | ((mn[:, 4:] >> 4) << 6),
            (sc[:, 4:] & 0xF) | ((mn[:, 4:] & 0xF) << 4),
        ],
        dim=-1,
    )


def _quant_k_asym(x: torch.Tensor, top: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K: the 16-byte head (d, dmin, scales) and codes [M, 8, 32] in ``0..top``."""
    xs = x.reshape(-1, 8, 32)
    s, mn = _minmax_subblocks(xs, top)
    dbytes, sc, s_q = _code_scales(s, 63)
    mbytes, mc, m_q = _code_scales(mn, 63)
    return torch.cat([dbytes, mbytes, _k_scale_bytes(sc, mc)], dim=-1), _asym_codes(xs, s_q, m_q, top)


def _quant_q4_k(x: torch.Tensor) -> torch.Tensor:
    head, q = _quant_k_asym(x, 15)
    return torch.cat([head, _pack(q.reshape(-1, 4, 2, 32), 4)], dim=-1)


def _quant_q5_k(x: torch.Tensor) -> torch.Tensor:
    head, q = _quant_k_asym(x, 31)
    qh = _pack((q >> 4).reshape(-1, 1, 8, 32), 1)
    return torch.cat([head, qh, _pack((q & 0xF).reshape(-1, 4, 2, 32), 4)], dim=-1)


def _quant_q6_k(x: torch.Tensor) -> torch.Tensor:
    xs = x.reshape(-1, 16, 16)
    dbytes, sc, s_q = _code_signed_scales(_signed_absmax(xs).squeeze(-1) / -32, -128, 127)
    q = (torch.round(_safe_div(xs, s_q.unsqueeze(-1))).clamp(-32, 31).to(torch.int16) + 32).reshape(-1, 256)
    ql = _pack((q & 0xF).reshape(-1, 2, 2, 64), 4)
    qh = _pack((q >> 4).reshape(-1, 2, 4, 32), 2)
    return torch.cat([ql, qh, sc.to(torch.int8).view(torch.uint8), dbytes], dim=-1)


_CODECS: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]] = {
    "q4_0": (_deq_q4_0, _quant_q4_0),
    "q4_1": (_deq_q4_1, _quant_q4_1),
    "q5_0": (_deq_q5_0, _quant_q5_0),
    "q5_1": (_deq_q5_1, _quant_q5_1),
    "q8_0": (_deq_q8_0, _quant_q8_0),
    "q2_k": (_deq_q2_k, _quant_q2_k),
    "q3_k": (_deq_q3_k, _quant_q3_k),
    "q4_k": (_deq_q4_k, _quant_q4_k),
    "q5_k": (_deq_q5_k, _quant_q5_k),
    "q6_k": (_deq_q6_k, _quant_q6_k),
}


# -- public API --------------------------------------------------------------------------------


def _type(gguf_type: str | None) -> str:
    t = (gguf_type or "").lower()
    if t not in _CODECS:
        raise GGUFBlockError(f"unknown GGUF type {gguf_type!r}; supported: {', '.join(_CODECS)}")
    return t


def dequantize_blocks(qweight: torch.Tensor, gguf_type: str) -> torch.Tensor:
    """uint8 [..., nbytes] of whole blocks -> fp32 [..., nbytes / T * B] (any leading dims, so
    embeddings and 3-D expert tensors decode the same way as linear weights)."""
    t = _type(gguf_type)
    B, T = BLOCK[t]
    if qweight.dtype != torch.uint8:
        raise GGUFBlockError(f"{t} qweight must be uint8 bytes, found {qweight.dtype}")
    if qweight.dim() == 0 or qweight.shape[-1] % T:
        found = qweight.shape[-1] if qweight.dim() else "a scalar"
        raise GGUFBlockError(f"{t} rows must be whole {T}-byte blocks, found {found} bytes per row")
    lead = qweight.shape[:-1]
    out = _CODECS[t][0](qweight.contiguous().reshape(-1, T))
    return out.reshape(*lead, qweight.shape[-1] // T * B)


def finite_blocks(qweight: torch.Tensor, gguf_type: str) -> torch.Tensor:
    """bool [..., nbytes / T]: True where every f16 field (d, m, dmin) of the block is finite.

    The dequantizers decode NaN/Inf scales faithfully, as llama.cpp does; a loader that treats a
    file as untrusted calls this to refuse such blocks with their position.
    """
    t = _type(gguf_type)
    _, T = BLOCK[t]
    if qweight.dtype != torch.uint8 or qweight.dim() == 0 or qweight.shape[-1] % T:
        raise GGUFBlockError(
            f"{t} qweight must be uint8 rows of whole {T}-byte blocks, "
            f"found {qweight.dtype} {list(qweight.shape)}"
        )
    b = qweight.contiguous().reshape(-1, T)
    ok = torch.ones(b.shape[0], dtype=torch.bool, device=b.device)
    step = 1 << 20  # blocks per pass: bounds the fp32 temporaries of a large table
    for i in range(0, b.shape[0], step):
        for off in F16_FIELDS[t]:
            ok[i : i + step] &= torch.isfinite(f16_field(b[i : i + step], off)).squeeze(-1)
    return ok.reshape(*qweight.shape[:-1], qweight.shape[-1] // T)


def quantize_blocks(w: torch.Tensor, gguf_type: str) -> torch.Tensor:
    """fp32 [..., K] -> uint8 [..., K / B * T] by round-to-nearest (see the module docstring)."""
    t = _type(gguf_type)
    B, T = BLOCK[t]
    if w.dim() == 0 or w.shape[-1] % B:
        found = w.shape[-1] if w.dim() else "a scalar"
        raise GGUFBlockError(f"{t}: K={found} is not a multiple of the {t} block size {B}")
    if not w.is_floating_point():
        raise GGUFBlockError(f"{t}: expected a floating-point weight, found {w.dtype}")
    x = w.detach().to(torch.float32).contiguous()
    if not bool(torch.isfinite(x).all()):
        raise GGUFBlockError(f"{t}: the weight holds NaN or Inf values, which GGUF blocks cannot encode")
    out = _CODECS[t][1](x.reshape(-1, B)).reshape(*x.shape[:-1], x.shape[-1] // B * T)
    if not bool(finite_blocks(out, t).all()):
        raise GGUFBlockError(
            f"{t}: max |w| = {x.abs().max().item():.6g} overflows the f16 block scale (f16 max 65504)"
        )
    return out


def quantize(
    w: torch.Tensor,
    scheme: Scheme,
    *,
    g_idx: torch.Tensor | None = None,
    output_sizes: tuple[int, ...] = (),
    calib: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Dense fp32 [N, K] -> {"qweight": uint8 [N, K/B*T]}; GGUF is weight-only with no act-order,
    so ``calib`` and ``output_sizes`` change nothing and a ``g_idx`` is refused."""
    if g_idx is not None:
        raise GGUFBlockError(f"{scheme}: GGUF blocks have no act-order, but a g_idx was given")
    if w.dim() != 2:
        raise GGUFBlockError(f"{scheme}: expected a 2-D [N, K] weight, found shape {list(w.shape)}")
    return {"qweight": quantize_blocks(w, _type(scheme.gguf_type))}


def dequantize(weight: CanonicalWeight) -> torch.Tensor:
    """Canonical GGUF blocks -> fp32 [N, K], after checking the byte count against N and K."""
    t = _type(weight.scheme.gguf_type)
    B, T = BLOCK[t]
    if weight.K % B:
        raise GGUFBlockError(f"{t}: K={weight.K} is not a multiple of the {t} block size {B}")
    q = weight["qweight"]
    want = (weight.N, weight.K // B * T)
    if tuple(q.shape) != want:
        raise GGUFBlockError(
            f"{t} qweight for N={weight.N}, K={weight.K} must be uint8 {list(want)} "
            f"({weight.K // B} blocks of {T} bytes per row), found {list(q.shape)}"
        )
    return dequantize_blocks(q, t)
