"""Bit packing of unsigned b-bit codes: the canonical uint8 layout and GPTQ-style int32 words.

Format adapters convert stored words with it, and the canonical helpers (which kernels repack
from) and the references pack and unpack codes with it: a layout of its own, not a reference.

Both layouts are one little-endian bit stream along the packed axis: code ``e`` occupies bits
``[b*e, b*e + b)`` of the stream, and bit ``j`` of the stream is bit ``j % 8`` of byte ``j // 8``
(or bit ``j % 32`` of word ``j // 32``: words are little-endian runs of four stream bytes). For
widths that divide the unit (2, 4, 8 bits) this is plain LSB-first packing; for other widths
(3 bits) codes straddle unit boundaries exactly as GPTQ's and compressed-tensors' dense streams do.

The stream repeats every ``lcm(b, 8)`` bits (at most 56), so codes are packed a period at a
time: ``P`` codes are shifted into one int64 and split into ``B`` bytes, and back. That keeps
the work vectorised over whole rows with no Python loop over elements. Widths that divide a
byte take a uint8 fast path, and a stream of little-endian int32 words *is* the canonical byte
stream (see :func:`words_as_bytes`), so converting GPTQ or compressed-tensors weights along K
is a byte view, not an unpack.
"""

from __future__ import annotations

import math

import torch

from .errors import ReferenceInputError

_INT_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def _check_bits(bits: int) -> None:
    if not isinstance(bits, int) or not 1 <= bits <= 8:
        raise ReferenceInputError(f"code width must be 1 to 8 bits, found {bits!r}")


def packed_length(n: int, bits: int, unit: int = 8) -> int:
    """Units (bytes for ``unit=8``, words for ``unit=32``) that hold ``n`` codes of ``bits`` bits."""
    return -(-n * bits // unit)


def _period(bits: int) -> tuple[int, int]:
    """(codes, bytes) of one repeat of the bit stream."""
    span = math.lcm(bits, 8)
    return span // bits, span // 8


def _pack_stream(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes [..., n] (int64, validated) -> stream bytes [..., ceil(n*bits/8)] as int64."""
    n = codes.shape[-1]
    P, B = _period(bits)
    groups = -(-n // P)
    c = torch.nn.functional.pad(codes, (0, groups * P - n)).reshape(*codes.shape[:-1], groups, P)
    shifts = torch.arange(P, device=codes.device) * bits
    v = (c << shifts).sum(dim=-1, keepdim=True)  # the codes never share a bit: sum == OR
    out = (v >> (torch.arange(B, device=codes.device) * 8)) & 0xFF
    return out.reshape(*codes.shape[:-1], groups * B)[..., : packed_length(n, bits)]


def _unpack_stream(data: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """Stream bytes [..., m] (int64 in [0, 256)) -> codes [..., n] as int64."""
    m = data.shape[-1]
    need = packed_length(n, bits)
    if m < need:
        raise ReferenceInputError(
            f"{n} codes of {bits} bits need {need} packed bytes along the packed dim, found {m}"
        )
    P, B = _period(bits)
    groups = -(-n // P)
    d = torch.nn.functional.pad(data[..., :need], (0, groups * B - need)).reshape(*data.shape[:-1], groups, B)
    v = (d << (torch.arange(B, device=data.device) * 8)).sum(dim=-1, keepdim=True)
    c = (v >> (torch.arange(P, device=data.device) * bits)) & ((1 << bits) - 1)
    return c.reshape(*data.shape[:-1], groups * P)[..., :n]


def _as_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    if codes.dtype not in _INT_DTYPES:
        raise ReferenceInputError(f"codes must be an integer tensor, found {codes.dtype}")
    c = codes if codes.dtype == torch.uint8 and 8 % bits == 0 else codes.to(torch.int64)
    if c.numel() and (int(c.min()) < 0 or int(c.max()) >= 1 << bits):
        raise ReferenceInputError(
            f"{bits}-bit codes must lie in [0, {(1 << bits) - 1}], found [{int(c.min())}, {int(c.max())}]"
        )
    return c


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack unsigned codes [..., K] along the last dim into uint8 [..., ceil(K*bits/8)].

    The canonical integer layout: each row is a little-endian bit stream, the last byte
    zero-padded, so any K packs (3-bit rows need not be a multiple of 8 codes long).
    Widths that divide a byte are packed in uint8 arithmetic (one byte per code of scratch).
    """
    _check_bits(bits)
    c = _as_codes(codes, bits)
    if 8 % bits:
        return _pack_stream(c, bits).to(torch.uint8)
    per = 8 // bits
    n = c.shape[-1]
    c = torch.nn.functional.pad(c.to(torch.uint8), (0, -n % per)).reshape(*c.shape[:-1], -1, per)
    out = c[..., 0].clone()
    for j in range(1, per):
        out |= c[..., j] << (bits * j)
    return out


def unpack_codes(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """Unpack uint8 [..., ceil(n*bits/8)] into ``n`` unsigned codes per row, uint8 [..., n]."""
    _check_bits(bits)
    if packed.dtype != torch.uint8:
        raise ReferenceInputError(f"packed codes must be uint8, found {packed.dtype}")
    if 8 % bits:
        return _unpack_stream(packed.to(torch.int64), bits, n).to(torch.uint8)
    need = packed_length(n, bits)
    if packed.shape[-1] < need:
        raise ReferenceInputError(
            f"{n} codes of {bits} bits need {need} packed bytes along the packed dim, found {packed.shape[-1]}"
        )
    per, mask = 8 // bits, (1 << bits) - 1
    p = packed[..., :need]
    parts = [(p >> (bits * j)) & mask for j in range(per)]
    return torch.stack(parts, dim=-1).reshape(*p.shape[:-1], need * per)[..., :n]


def pack_int32(codes: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """Pack unsigned codes along ``dim`` into int32 words, LSB-first (GPTQ ``qweight``/``qzeros``).

    Widths that divide 32 give ``pf = 32/bits`` codes per word, code ``j`` of a word at bits
    ``[bits*j, bits*j + bits)``; 3 bits gives the dense stream (32 codes in 3 words). A ragged
    end is zero-padded. Words are returned as int32 bit patterns (top bit set -> negative).
    """
    _check_bits(bits)
    c = _as_codes(codes, bits).to(torch.int64).movedim(dim, -1)
    data = _pack_stream(c, bits)
    words = packed_length(c.shape[-1], bits, 32)
    data = torch.nn.functional.pad(data, (0, 4 * words - data.shape[-1])).reshape(*c.shape[:-1], words, 4)
    w = (data << torch.tensor([0, 8, 16, 24], device=data.device)).sum(-1)
    w = torch.where(w >= 1 << 31, w - (1 << 32), w)
    return w.to(torch.int32).movedim(-1, dim).contiguous()


def unpack_int32(packed: torch.Tensor, bits: int, dim: int, n: int | None = None) -> torch.Tensor:
    """Unpack int32 words along ``dim`` into unsigned codes (int32), the inverse of :func:`pack_int32`.

    ``n``: codes to read along ``dim`` (default: every whole code the words hold).
    """
    _check_bits(bits)
    if packed.dtype != torch.int32:
        raise ReferenceInputError(f"packed words must be int32, found {packed.dtype}")
    words = packed.movedim(dim, -1).to(torch.int64) & 0xFFFFFFFF
    data = (words.unsqueeze(-1) >> torch.tensor([0, 8, 16, 24], device=words.device)) & 0xFF
    data = data.reshape(*words.shape[:-1], words.shape[-1] * 4)
    count = words.shape[-1] * 32 // bits if n is None else n
    if packed_length(count, bits, 32) > words.shape[-1]:
        raise ReferenceInputError(
            f"{count} codes of {bits} bits need {packed_length(count, bits, 32)} int32 words "
            f"along dim {dim}, found {words.shape[-1]}"
        )
    return _unpack_stream(data, bits, count).to(torch.int32).movedim(-1, dim).contiguous()


def words_as_bytes(words: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """int32 words packing ``n`` codes along the LAST dim (LSB-first stream) as canonical bytes.

    A little-endian word holds stream bits ``[32w, 32w + 32)`` in bytes ``4w .. 4w + 3``, so
    the words' bytes are the canonical uint8 stream; only the padding is dropped.
    """
    if words.dtype != torch.int32:
        raise ReferenceInputError(f"packed words must be int32, found {words.dtype}")
    need = packed_length(n, bits)
    if 4 * words.shape[-1] < need:
        raise ReferenceInputError(f"{n} codes of {bits} bits need {need} bytes, found {4 * words.shape[-1]}")
    return words.contiguous().view(torch.uint8)[..., :need].contiguous()
