"""Schemes: what the numbers mean, independent of how a file stores them.

A :class:`Scheme` is frozen and hashable. Its short string form is what logs, golden plans,
the CLI and environment variables use. The grammar, token by token::

    w<bits>a<abits>-<weight>[-<granularity>][-sym|-asym][-actorder][-dq][-s<dtype>][-a<type>][-<act>]
    gguf-<type>

    weight       int | fp8 (e4m3) | fp8e5m2 | nvfp4 | mxfp4 | nf4 | bnbfp4
    granularity  tensor | ch | g<G> | block<B> (B x B) | block<BN>x<BK>
    -s<dtype>    scale storage type when it is not the family default (fp32, fp16, bf16)
    -a<type>     activation type when it is not the default for the weight family (afp8, aint8)
    <act>        tok (dynamic per token) | static (static per tensor) | dyn (dynamic per tensor)
                 | tokg<G> (dynamic per token, groups of G channels)

Examples: ``w4a16-int-g128-asym``, ``w8a8-int-ch-sym``, ``w8a8-fp8-block128``, ``w4a4-nvfp4``,
``w4a16-nf4-g64-dq``, ``gguf-q4_k``. Defaults are left out of the canonical string, so
``format(parse(s))`` is the canonical spelling of ``s`` and ``parse(format(x)) == x``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from .errors import QuantrtError

# weight token -> (weight type, bits)
_WEIGHT_TOKENS = {
    "int": "int",
    "fp8": "fp8_e4m3",
    "fp8e4m3": "fp8_e4m3",
    "fp8e5m2": "fp8_e5m2",
    "nvfp4": "nvfp4",
    "mxfp4": "mxfp4",
    "nf4": "nf4",
    "bnbfp4": "fp4_bnb",
}
_WEIGHT_CANON = {
    "int": "int",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8e5m2",
    "nvfp4": "nvfp4",
    "mxfp4": "mxfp4",
    "nf4": "nf4",
    "fp4_bnb": "bnbfp4",
}

#: GGUF block types the catalog covers -> (elements per block, bytes per block, nominal bits)
GGUF_TYPES: dict[str, tuple[int, int, int]] = {
    "q4_0": (32, 18, 4),
    "q4_1": (32, 20, 4),
    "q5_0": (32, 22, 5),
    "q5_1": (32, 24, 5),
    "q8_0": (32, 34, 8),
    "q2_k": (256, 84, 2),
    "q3_k": (256, 110, 3),
    "q4_k": (256, 144, 4),
    "q5_k": (256, 176, 5),
    "q6_k": (256, 210, 6),
}

SCALE_DTYPES = ("fp32", "fp16", "bf16", "e4m3", "e8m0")
ACT_TYPES = ("int8", "fp8_e4m3", "nvfp4")
ACT_GRANULARITIES = ("token", "tensor", "token_group")


class SchemeError(QuantrtError, ValueError):
    """A scheme string or field combination that does not describe valid numerics."""


@dataclass(frozen=True)
class Scheme:
    """The numerics of one quantized linear weight (and its activations).

    weight:       ``int``, ``fp8_e4m3``, ``fp8_e5m2``, ``nvfp4``, ``mxfp4``, ``nf4``, ``fp4_bnb``, ``gguf``
    bits:         weight bits (GGUF: the type's nominal bits)
    granularity:  ``tensor``, ``channel``, ``group`` (``group_size`` along K) or ``block``
    block:        (rows, cols) of a block scale, for ``block``
    symmetric:    False when integer weights carry zero-points
    scale_dtype:  how scales are stored: fp32, fp16, bf16, e4m3 (NVFP4), e8m0 (MXFP4)
    double_quant: bitsandbytes' second-level quantization of the absmax scales
    act:          None (16-bit activations) or the activation type: int8, fp8_e4m3, nvfp4
    act_granularity / act_dynamic / act_group: how activation scales are found
    act_order:    GPTQ act-order: input channels carry a group index (g_idx)
    gguf_type:    the GGUF block type (``q4_k`` ...) when weight is ``gguf``
    """

    weight: str
    bits: int
    granularity: str = "group"
    group_size: int | None = None
    block: tuple[int, int] | None = None
    symmetric: bool = True
    scale_dtype: str = "fp16"
    double_quant: bool = False
    act: str | None = None
    act_granularity: str | None = None
    act_dynamic: bool = True
    act_group: int | None = None
    act_order: bool = False
    gguf_type: str | None = None

    def __post_init__(self) -> None:
        _validate(self)

    # -- derived facts -------------------------------------------------------------------
    @property
    def family(self) -> str:
        """Which canonical layout and reference serve this scheme."""
        if self.weight == "int":
            return "int"
        if self.weight.startswith("fp8"):
            return "fp8"
        if self.weight in ("nf4", "fp4_bnb"):
            return "bnb4"
        return self.weight  # nvfp4, mxfp4, gguf

    @property
    def weight_only(self) -> bool:
        return self.act is None

    @property
    def act_bits(self) -> int:
        return {None: 16, "int8": 8, "fp8_e4m3": 8, "nvfp4": 4}[self.act]

    @property
    def name(self) -> str:
        return format_scheme(self)

    def __str__(self) -> str:
        return format_scheme(self)

    def with_(self, **changes: object) -> Scheme:
        """A copy with some fields changed (validated)."""
        return replace(self, **changes)


def default_scale_dtype(weight: str) -> str:
    return {
        "int": "fp16",
        "fp8_e4m3": "fp32",
        "fp8_e5m2": "fp32",
        "nvfp4": "e4m3",
        "mxfp4": "e8m0",
        "nf4": "fp32",
        "fp4_bnb": "fp32",
        "gguf": "fp16",
    }[weight]


def default_act_type(weight: str, act_bits: int) -> str | None:
    if act_bits == 16:
        return None
    if act_bits == 4:
        return "nvfp4"
    return "fp8_e4m3" if weight.startswith("fp8") else "int8"


def _fail(scheme: Scheme, why: str) -> SchemeError:
    return SchemeError(f"invalid scheme {scheme!r}: {why}")


def _validate(s: Scheme) -> None:
    if s.weight == "gguf":
        if s.gguf_type not in GGUF_TYPES:
            raise _fail(s, f"gguf_type must be one of {sorted(GGUF_TYPES)}, found {s.gguf_type!r}")
        if s.act is not None or s.act_order:
            raise _fail(s, "GGUF schemes are weight-only and have no act-order")
        return
    if s.gguf_type is not None:
        raise _fail(s, "gguf_type is only valid with weight='gguf'")
    if s.weight not in _WEIGHT_CANON:
        raise _fail(s, f"unknown weight type {s.weight!r}")
    if s.scale_dtype not in SCALE_DTYPES:
        raise _fail(s, f"scale_dtype must be one of {SCALE_DTYPES}, found {s.scale_dtype!r}")
    if s.granularity not in ("tensor", "channel", "group", "block"):
        raise _fail(s, f"granularity must be tensor, channel, group or block, found {s.granularity!r}")
    if s.granularity == "group":
        if not isinstance(s.group_size, int) or s.group_size <= 0:
            raise _fail(s, f"group granularity needs a positive group_size, found {s.group_size!r}")
    elif s.group_size is not None:
        raise _fail(s, f"group_size is only valid with group granularity, found {s.group_size}")
    if s.granularity == "block":
        if not (
            isinstance(s.block, tuple)
            and len(s.block) == 2
            and all(isinstance(b, int) and b > 0 for b in s.block)
        ):
            raise _fail(s, f"block granularity needs block=(rows, cols), found {s.block!r}")
    elif s.block is not None:
        raise _fail(s, "block is only valid with block granularity")
    if s.act is not None and s.act not in ACT_TYPES:
        raise _fail(s, f"act must be None or one of {ACT_TYPES}, found {s.act!r}")
    if s.act is None:
        if s.act_granularity is not None or s.act_group is not None:
            raise _fail(s, "weight-only schemes have no activation granularity")
    else:
        if s.act_granularity not in ACT_GRANULARITIES:
            raise _fail(s, f"act_granularity must be one of {ACT_GRANULARITIES}, found {s.act_granularity!r}")
        if s.act_granularity == "token" and not s.act_dynamic:
            raise _fail(s, "per-token activation scales are always dynamic")
        if s.act_granularity == "token_group":
            if not s.act_dynamic or not isinstance(s.act_group, int) or s.act_group <= 0:
                raise _fail(s, "token_group activations need act_dynamic=True and a positive act_group")
        elif s.act_group is not None:
            raise _fail(s, "act_group is only valid with token_group activations")
    if s.double_quant and s.family != "bnb4":
        raise _fail(s, "double_quant is only valid for bitsandbytes 4-bit (nf4, fp4_bnb)")
    if s.act_order and not (s.weight == "int" and s.granularity == "group" and s.act is None):
        raise _fail(s, "act_order needs integer weight-only group quantization")

    fam = s.family
    if fam == "int":
        if s.bits not in (2, 3, 4, 8):
            raise _fail(s, f"integer weights have 2, 3, 4 or 8 bits, found {s.bits}")
        if s.granularity == "block":
            raise _fail(s, "integer weights use tensor, channel or group scales")
        if s.scale_dtype not in ("fp32", "fp16", "bf16"):
            raise _fail(s, f"integer scales are fp32, fp16 or bf16, found {s.scale_dtype}")
        if s.act == "int8":
            if s.bits not in (4, 8) or not s.symmetric or (s.granularity == "group" and s.bits == 8):
                raise _fail(s, "int8 activations pair with symmetric 8-bit tensor/channel or 4-bit weights")
            if s.act_granularity not in ("token", "tensor"):
                raise _fail(s, "int8 activations are per token (dynamic) or per tensor")
        elif s.act == "fp8_e4m3":
            if s.bits != 4 or not s.symmetric or s.granularity not in ("group", "channel"):
                raise _fail(
                    s, "fp8 activations with integer weights need symmetric int4 group/channel (W4A8)"
                )
            if s.act_granularity != "token":
                raise _fail(s, "W4A8 activations are dynamic per token")
        elif s.act == "nvfp4":
            raise _fail(s, "nvfp4 activations need nvfp4 weights")
    elif fam == "fp8":
        if s.bits != 8 or not s.symmetric:
            raise _fail(s, "fp8 weights have 8 bits and no zero-point")
        if s.granularity == "group":
            raise _fail(s, "fp8 weights use tensor, channel or block scales")
        if s.scale_dtype not in ("fp32", "fp16", "bf16"):
            raise _fail(s, f"fp8 scales are fp32, fp16 or bf16, found {s.scale_dtype}")
        if s.act not in (None, "fp8_e4m3"):
            raise _fail(s, f"fp8 weights pair with fp8 activations or none, found {s.act}")
        if s.granularity == "block" and s.act is not None and s.act_granularity != "token_group":
            raise _fail(s, "block fp8 weights pair with dynamic per-token-group activations")
    elif fam == "nvfp4":
        if (s.bits, s.granularity, s.group_size, s.scale_dtype, s.symmetric) != (
            4,
            "group",
            16,
            "e4m3",
            True,
        ):
            raise _fail(s, "nvfp4 is 4-bit e2m1 with e4m3 scales per 16 and a global fp32 scale")
        if s.act not in (None, "nvfp4"):
            raise _fail(s, "nvfp4 weights pair with nvfp4 activations or none")
        if s.act == "nvfp4" and (s.act_granularity, s.act_group) != ("token_group", 16):
            raise _fail(s, "nvfp4 activations are quantized dynamically in groups of 16")
    elif fam == "mxfp4":
        if (s.bits, s.granularity, s.group_size, s.scale_dtype, s.symmetric) != (
            4,
            "group",
            32,
            "e8m0",
            True,
        ):
            raise _fail(s, "mxfp4 is 4-bit e2m1 with e8m0 scales per 32")
        if s.act is not None:
            raise _fail(s, "mxfp4 is weight-only in the catalog")
    elif fam == "bnb4":
        if s.bits != 4 or s.granularity != "group" or not s.symmetric or s.act is not None:
            raise _fail(s, "bitsandbytes 4-bit is weight-only absmax blocks (granularity group)")
        gs = s.group_size or 0
        if gs < 32 or gs > 4096 or gs & (gs - 1):
            raise _fail(s, f"bitsandbytes blocksize is a power of two from 32 to 4096, found {gs}")
        if s.scale_dtype != "fp32":
            raise _fail(s, "bitsandbytes absmax is fp32 (double quant is a separate flag)")


# -- string form ---------------------------------------------------------------------------

_HEAD = re.compile(r"^w(\d+)a(\d+)$")
_ACT_TOKENS = {"tok": ("token", True), "static": ("tensor", False), "dyn": ("tensor", True)}


def parse_scheme(text: str) -> Scheme:
    """Parse a scheme string; a bad string raises SchemeError naming the bad part."""
    if isinstance(text, Scheme):
        return text
    if not isinstance(text, str) or not text.strip():
        raise SchemeError(f"empty scheme string {text!r}")
    raw = text
    text = text.strip().lower()
    parts = text.split("-")
    if parts[0] == "gguf":
        if len(parts) != 2:
            raise SchemeError(f"{raw!r}: a GGUF scheme is 'gguf-<type>', e.g. gguf-q4_k")
        gt = parts[1]
        if gt not in GGUF_TYPES:
            raise SchemeError(
                f"{raw!r}: unknown GGUF type {gt!r}; supported: {', '.join(GGUF_TYPES)}"
                + ("; IQ types are not supported yet" if gt.startswith("iq") else "")
            )
        return Scheme(
            weight="gguf",
            bits=GGUF_TYPES[gt][2],
            granularity="group",
            group_size=GGUF_TYPES[gt][0],
            scale_dtype="fp16",
            gguf_type=gt,
        )
    m = _HEAD.match(parts[0])
    if not m:
        raise SchemeError(f"{raw!r}: first part {parts[0]!r} should be w<bits>a<bits> (e.g. w4a16) or 'gguf'")
    wbits, abits = int(m.group(1)), int(m.group(2))
    if abits not in (4, 8, 16):
        raise SchemeError(f"{raw!r}: activation bits in {parts[0]!r} must be 4, 8 or 16, found {abits}")
    if len(parts) < 2:
        raise SchemeError(
            f"{raw!r}: missing the weight type after {parts[0]!r} "
            f"(one of {', '.join(sorted(_WEIGHT_TOKENS))})"
        )
    wtok = parts[1]
    if wtok not in _WEIGHT_TOKENS:
        raise SchemeError(
            f"{raw!r}: unknown weight type {wtok!r}; known: {', '.join(sorted(_WEIGHT_TOKENS))}"
        )
    weight = _WEIGHT_TOKENS[wtok]

    kw: dict[str, object] = {"weight": weight, "bits": wbits}
    fixed = {"nvfp4": ("group", 16), "mxfp4": ("group", 32)}
    if weight in fixed:
        kw["granularity"], kw["group_size"] = fixed[weight]
    act_type = default_act_type(weight, abits)
    act_gran: tuple[str, bool, int | None] | None = None
    seen_sym = False
    gran_given = False
    scale_dtype = None
    rest = parts[2:]
    for i, tok in enumerate(rest):
        where = f"{raw!r}: part {i + 3} {tok!r}"
        if tok in ("sym", "asym"):
            if seen_sym:
                raise SchemeError(f"{where}: symmetry given twice")
            seen_sym = True
            kw["symmetric"] = tok == "sym"
        elif tok == "actorder":
            kw["act_order"] = True
        elif tok == "dq":
            kw["double_quant"] = True
        elif tok in ("tensor", "ch") or re.fullmatch(r"g\d+|block\d+(x\d+)?", tok):
            if weight in fixed:
                raise SchemeError(f"{where}: {wtok} has a fixed block size; drop the granularity part")
            if gran_given:
                raise SchemeError(f"{where}: granularity given twice")
            gran_given = True
            if tok == "tensor":
                kw.update(granularity="tensor")
            elif tok == "ch":
                kw.update(granularity="channel")
            elif tok.startswith("g"):
                kw.update(granularity="group", group_size=int(tok[1:]))
            else:
                dims = tok[5:].split("x")
                bn = int(dims[0])
                bk = int(dims[1]) if len(dims) == 2 else bn
                kw.update(granularity="block", block=(bn, bk))
        elif re.fullmatch(r"s(fp32|fp16|bf16)", tok):
            scale_dtype = tok[1:]
        elif tok in ("afp8", "aint8"):
            if abits != 8:
                raise SchemeError(f"{where}: an activation type needs 8-bit activations (w<b>a8)")
            act_type = "fp8_e4m3" if tok == "afp8" else "int8"
        elif tok in _ACT_TOKENS:
            g, dyn = _ACT_TOKENS[tok]
            act_gran = (g, dyn, None)
        elif re.fullmatch(r"tokg\d+", tok):
            act_gran = ("token_group", True, int(tok[4:]))
        else:
            raise SchemeError(
                f"{where} is not understood; expected a granularity (tensor, ch, g<G>, block<B>[x<B>]), "
                "sym/asym, actorder, dq, s<fp32|fp16|bf16>, afp8/aint8, or an activation mode "
                "(tok, static, dyn, tokg<G>)"
            )
    if weight in ("int",) and "granularity" not in kw:
        raise SchemeError(f"{raw!r}: integer weights need a granularity (tensor, ch or g<G>)")
    if weight in ("nf4", "fp4_bnb") and "granularity" not in kw:
        raise SchemeError(f"{raw!r}: bitsandbytes weights need a blocksize, e.g. g64")
    if weight.startswith("fp8") and "granularity" not in kw:
        raise SchemeError(f"{raw!r}: fp8 weights need a granularity (tensor, ch or block128)")
    if weight == "int" and not seen_sym:
        raise SchemeError(f"{raw!r}: integer weights need 'sym' or 'asym'")
    kw["scale_dtype"] = scale_dtype or default_scale_dtype(weight)
    if act_type is not None:
        if act_gran is None:
            act_gran = _default_act_granularity(weight, act_type, kw)
        kw.update(act=act_type, act_granularity=act_gran[0], act_dynamic=act_gran[1], act_group=act_gran[2])
    elif act_gran is not None:
        raise SchemeError(
            f"{raw!r}: an activation mode needs quantized activations (a8 or a4), found a{abits}"
        )
    try:
        return Scheme(**kw)  # type: ignore[arg-type]
    except SchemeError as e:
        raise SchemeError(f"{raw!r}: {str(e).split(': ', 1)[-1]}") from None


def _default_act_granularity(weight: str, act: str, kw: dict[str, object]) -> tuple[str, bool, int | None]:
    if act == "nvfp4":
        return ("token_group", True, 16)
    if kw.get("granularity") == "block" and act == "fp8_e4m3":
        return ("token_group", True, kw["block"][1])  # type: ignore[index]
    return ("token", True, None)


def format_scheme(s: Scheme) -> str:
    """The canonical string of a scheme (defaults left out)."""
    if s.weight == "gguf":
        return f"gguf-{s.gguf_type}"
    parts = [f"w{s.bits}a{s.act_bits}", _WEIGHT_CANON[s.weight]]
    if s.weight not in ("nvfp4", "mxfp4"):
        if s.granularity == "tensor":
            parts.append("tensor")
        elif s.granularity == "channel":
            parts.append("ch")
        elif s.granularity == "group":
            parts.append(f"g{s.group_size}")
        else:
            bn, bk = s.block  # type: ignore[misc]
            parts.append(f"block{bn}" if bn == bk else f"block{bn}x{bk}")
    if s.weight == "int":
        parts.append("sym" if s.symmetric else "asym")
    if s.act_order:
        parts.append("actorder")
    if s.double_quant:
        parts.append("dq")
    if s.scale_dtype != default_scale_dtype(s.weight):
        parts.append(f"s{s.scale_dtype}")
    if s.act is not None:
        if s.act != default_act_type(s.weight, s.act_bits):
            parts.append({"fp8_e4m3": "afp8", "int8": "aint8"}[s.act])
        kw = {"granularity": s.granularity, "block": s.block}
        default = _default_act_granularity(s.weight, s.act, kw)
        mine = (s.act_granularity, s.act_dynamic, s.act_group)
        if mine != default:
            if s.act_granularity == "token":
                parts.append("tok")
            elif s.act_granularity == "tensor":
                parts.append("dyn" if s.act_dynamic else "static")
            else:
                parts.append(f"tokg{s.act_group}")
    return "-".join(parts)


# -- KV cache ------------------------------------------------------------------------------

_KV_TYPES = {"fp8": "fp8_e4m3", "fp8e4m3": "fp8_e4m3", "fp8e5m2": "fp8_e5m2", "int8": "int8"}
_KV_CANON = {"fp8_e4m3": "fp8", "fp8_e5m2": "fp8e5m2", "int8": "int8"}
_KV_GRANULARITY = ("tensor", "head", "token", "group")


@dataclass(frozen=True)
class KVCacheScheme:
    """How the KV cache stores keys and values: element type and scale granularity.

    Scales are multipliers: the cache stores ``q = sat(round(x / scale))`` and reads ``q * scale``.
    ``granularity``: ``tensor`` (one scale for K, one for V, per layer) or ``head`` (one per KV head):
    static, from the checkpoint or calibrated on the first prefill; ``token`` (one per token and KV
    head) or ``group`` (one per ``group_size`` channels of a token's head): dynamic, computed as each
    token is written and stored beside it.
    """

    dtype: str
    granularity: str = "tensor"
    group_size: int = 0

    def __post_init__(self) -> None:
        if self.dtype not in _KV_CANON:
            raise SchemeError(
                f"invalid KV-cache scheme: dtype must be one of {sorted(_KV_CANON)}, found {self.dtype!r}"
            )
        if self.granularity not in _KV_GRANULARITY:
            raise SchemeError(
                f"invalid KV-cache scheme: granularity must be one of {list(_KV_GRANULARITY)}, "
                f"found {self.granularity!r}"
            )
        if (self.granularity == "group") != (self.group_size > 0):
            raise SchemeError(
                f"invalid KV-cache scheme: group_size {self.group_size} goes with granularity 'group' only"
            )

    @property
    def dynamic(self) -> bool:
        """Scales computed per token as it is written (token, group), not fixed per layer."""
        return self.granularity in ("token", "group")

    @property
    def name(self) -> str:
        base = f"kv-{_KV_CANON[self.dtype]}"
        if self.granularity == "group":
            return f"{base}-g{self.group_size}"
        return base + ("" if self.granularity == "tensor" else f"-{self.granularity}")

    def __str__(self) -> str:
        return self.name


#: TurboQuant presets by vLLM's ``--kv-cache-dtype`` names: (key bits, value bits, norm correction)
TURBOQUANT_PRESETS = {
    "k8v4": (8, 4, False),
    "4bit_nc": (4, 4, True),
    "k3v4_nc": (3, 4, True),
    "3bit_nc": (3, 3, True),
}


@dataclass(frozen=True)
class TurboQuantScheme:
    """TurboQuant KV cache: keys rotated (randomised Hadamard) and coded by a Lloyd-Max codebook
    with their norm in fp16 (``key_bits`` 3 or 4), or fp8 e4m3 keys unrotated (``key_bits`` 8);
    values uniform asymmetric per token and head (``value_bits`` 3 or 4) with fp16 scale and zero.
    ``norm_correction`` stores the key norm divided by the chosen centroids' norm, so a read-back
    key has exactly the written key's norm. docs/schemes.md gives every bit."""

    key_bits: int
    value_bits: int
    norm_correction: bool = False

    def __post_init__(self) -> None:
        if self.key_bits not in (3, 4, 8) or self.value_bits not in (3, 4):
            raise SchemeError(
                f"invalid TurboQuant scheme: key bits must be 3, 4 or 8 and value bits 3 or 4, "
                f"found k{self.key_bits}v{self.value_bits}"
            )
        if self.key_bits == 8 and self.norm_correction:
            raise SchemeError("invalid TurboQuant scheme: fp8 keys (k8) have no norm to correct")

    @property
    def dynamic(self) -> bool:
        return True

    @property
    def preset(self) -> str | None:
        for name, bits in TURBOQUANT_PRESETS.items():
            if bits == (self.key_bits, self.value_bits, self.norm_correction):
                return name
        return None

    @property
    def name(self) -> str:
        preset = self.preset
        if preset is not None:
            return "kv-tq-" + preset.replace("_", "-")
        return f"kv-tq-k{self.key_bits}v{self.value_bits}" + ("-nc" if self.norm_correction else "")

    def __str__(self) -> str:
        return self.name


KVScheme = KVCacheScheme | TurboQuantScheme


def parse_kv_scheme(text: str) -> KVScheme:
    """Parse ``kv-<fp8|fp8e5m2|int8>[-tensor|-head|-token|-g<G>]`` or ``kv-tq-<preset>`` (``k8v4``,
    ``4bit-nc``, ``k3v4-nc``, ``3bit-nc``, or ``k<b>v<b>[-nc]``)."""
    t = text.strip().lower()
    parts = t.split("-")
    if parts[0] != "kv" or len(parts) < 2:
        raise SchemeError(
            f"{text!r}: a KV-cache scheme is 'kv-<fp8|fp8e5m2|int8>[-head|-token|-g<G>]' or 'kv-tq-<preset>'"
        )
    if parts[1] == "tq":
        rest = "_".join(parts[2:])
        if rest in TURBOQUANT_PRESETS:
            return TurboQuantScheme(*TURBOQUANT_PRESETS[rest])
        m = re.fullmatch(r"k(\d)v(\d)(_nc)?", rest)
        if not m:
            raise SchemeError(
                f"{text!r}: unknown TurboQuant preset {rest!r}; known: {', '.join(TURBOQUANT_PRESETS)} "
                "or k<bits>v<bits>[-nc]"
            )
        return TurboQuantScheme(int(m.group(1)), int(m.group(2)), bool(m.group(3)))
    if len(parts) not in (2, 3):
        raise SchemeError(f"{text!r}: a KV-cache scheme is 'kv-<fp8|fp8e5m2|int8>[-head|-token|-g<G>]'")
    if parts[1] not in _KV_TYPES:
        raise SchemeError(f"{text!r}: unknown KV-cache type {parts[1]!r}; known: fp8, fp8e5m2, int8")
    gran = parts[2] if len(parts) == 3 else "tensor"
    m = re.fullmatch(r"g(\d+)", gran)
    if m:
        if int(m.group(1)) <= 0:
            raise SchemeError(f"{text!r}: the group size must be positive")
        return KVCacheScheme(_KV_TYPES[parts[1]], "group", int(m.group(1)))
    if gran not in ("tensor", "head", "token"):
        raise SchemeError(
            f"{text!r}: unknown KV-cache granularity {gran!r}; known: tensor, head, token, g<G>"
        )
    return KVCacheScheme(_KV_TYPES[parts[1]], gran)


#: what ``--kv-cache`` accepts besides quantrt's own names: vLLM's ``--kv-cache-dtype`` values
KV_ALIASES = {
    "fp8": "kv-fp8",
    "fp8_e4m3": "kv-fp8",
    "fp8_e5m2": "kv-fp8e5m2",
    "int8": "kv-int8-token",
    "int8_per_token_head": "kv-int8-token",
    "fp8_per_token_head": "kv-fp8-token",
    **{f"turboquant_{p}": "kv-tq-" + p.replace("_", "-") for p in TURBOQUANT_PRESETS},
}


def kv_scheme_from_name(text: str) -> KVScheme:
    """A quantrt KV scheme name or one of vLLM's ``--kv-cache-dtype`` values (``fp8``, ``int8``,
    ``turboquant_4bit_nc``, ...)."""
    t = text.strip().lower()
    return parse_kv_scheme(KV_ALIASES.get(t, t))


# -- the catalog ---------------------------------------------------------------------------

_CATALOG_STRINGS = (
    # integer weight-only
    "w4a16-int-g128-sym",
    "w4a16-int-g128-asym",
    "w4a16-int-g32-sym",
    "w4a16-int-g64-asym",
    "w4a16-int-ch-sym",
    "w4a16-int-ch-asym",
    "w4a16-int-g128-sym-actorder",
    "w4a16-int-g128-asym-actorder",
    "w8a16-int-ch-sym",
    "w8a16-int-g128-sym",
    "w8a16-int-g128-asym",
    "w3a16-int-g128-asym",
    "w3a16-int-g128-sym",
    "w2a16-int-g128-asym",
    "w2a16-int-g64-sym",
    # W8A8 int8 and W4A8
    "w8a8-int-ch-sym",
    "w8a8-int-ch-sym-static",
    "w8a8-int-tensor-sym-static",
    "w4a8-int-g128-sym-afp8",
    # fp8 weight-only and W8A8
    "w8a16-fp8-tensor",
    "w8a16-fp8-ch",
    "w8a16-fp8-block128",
    "w8a16-fp8e5m2-tensor",
    "w8a16-fp8e5m2-ch",
    "w8a16-fp8e5m2-block128",
    "w8a8-fp8-tensor",
    "w8a8-fp8-tensor-static",
    "w8a8-fp8-ch",
    "w8a8-fp8-ch-static",
    "w8a8-fp8-block128",
    # fp4
    "w4a16-nvfp4",
    "w4a4-nvfp4",
    "w4a16-mxfp4",
    # bitsandbytes (int8 is w8a16-int-ch-sym with fp32 scales: LLM.int8's outlier split is not reproduced)
    "w4a16-nf4-g64",
    "w4a16-nf4-g64-dq",
    "w4a16-bnbfp4-g64",
    "w4a16-bnbfp4-g64-dq",
    "w8a16-int-ch-sym-sfp32",
    # GGUF
    *(f"gguf-{t}" for t in GGUF_TYPES),
)


def catalog() -> tuple[Scheme, ...]:
    """The schemes quantrt names, references and plans for (golden plans cover each)."""
    return tuple(parse_scheme(s) for s in _CATALOG_STRINGS)


KV_CATALOG = (
    "kv-fp8",
    "kv-fp8-head",
    "kv-fp8-token",
    "kv-fp8e5m2",
    "kv-fp8e5m2-head",
    "kv-int8",
    "kv-int8-head",
    "kv-int8-token",
    "kv-int8-g32",
    "kv-tq-k8v4",
    "kv-tq-4bit-nc",
    "kv-tq-k3v4-nc",
    "kv-tq-3bit-nc",
)
