"""Scheme strings: round-trip, canonical spellings, and errors that name the bad part."""

import pytest

from quantrt.schemes import (
    GGUF_TYPES,
    KV_CATALOG,
    KVCacheScheme,
    Scheme,
    SchemeError,
    TurboQuantScheme,
    catalog,
    format_scheme,
    kv_scheme_from_name,
    parse_kv_scheme,
    parse_scheme,
)


@pytest.mark.parametrize("scheme", catalog(), ids=str)
def test_catalog_round_trips(scheme: Scheme) -> None:
    text = format_scheme(scheme)
    assert parse_scheme(text) == scheme
    assert format_scheme(parse_scheme(text)) == text
    assert hash(parse_scheme(text)) == hash(scheme)


def test_catalog_covers_the_issue_list() -> None:
    names = {s.name for s in catalog()}
    fams = {s.family for s in catalog()}
    assert fams == {"int", "fp8", "nvfp4", "mxfp4", "bnb4", "gguf"}
    for bits in (2, 3, 4, 8):
        assert any(s.weight == "int" and s.bits == bits and s.weight_only for s in catalog())
    assert {f"gguf-{t}" for t in GGUF_TYPES} <= names
    assert {
        "w4a16-int-g128-sym-actorder",
        "w8a8-int-ch-sym",
        "w8a8-int-ch-sym-static",
        "w4a8-int-g128-sym-afp8",
        "w8a8-fp8-block128",
        "w8a16-fp8e5m2-tensor",
        "w4a4-nvfp4",
        "w4a16-nvfp4",
        "w4a16-mxfp4",
        "w4a16-nf4-g64-dq",
        "w4a16-bnbfp4-g64",
    } <= names


def test_fields_of_known_strings() -> None:
    s = parse_scheme("w4a16-int-g128-asym")
    assert (s.weight, s.bits, s.granularity, s.group_size, s.symmetric, s.act) == (
        "int",
        4,
        "group",
        128,
        False,
        None,
    )
    s = parse_scheme("w8a8-fp8-block128")
    assert (s.granularity, s.block, s.act, s.act_granularity, s.act_group) == (
        "block",
        (128, 128),
        "fp8_e4m3",
        "token_group",
        128,
    )
    s = parse_scheme("w8a8-int-ch-sym-static")
    assert (s.act, s.act_granularity, s.act_dynamic) == ("int8", "tensor", False)
    s = parse_scheme("w4a8-int-g128-sym-afp8")
    assert (s.bits, s.act, s.act_granularity) == (4, "fp8_e4m3", "token")
    s = parse_scheme("w4a4-nvfp4")
    assert (s.group_size, s.scale_dtype, s.act, s.act_group) == (16, "e4m3", "nvfp4", 16)
    s = parse_scheme("gguf-q4_k")
    assert (s.weight, s.gguf_type, s.bits, s.group_size) == ("gguf", "q4_k", 4, 256)


@pytest.mark.parametrize(
    "text,canonical",
    [
        ("W4A16-INT-G128-ASYM", "w4a16-int-g128-asym"),
        ("w8a8-fp8-ch-tok", "w8a8-fp8-ch"),
        ("w8a8-fp8-block128x128-tokg128", "w8a8-fp8-block128"),
        ("w8a16-fp8e4m3-tensor", "w8a16-fp8-tensor"),
        ("w4a16-int-g128-sym-sfp16", "w4a16-int-g128-sym"),
        ("w4a16-int-g128-sym-sbf16", "w4a16-int-g128-sym-sbf16"),
        ("w8a8-fp8-tensor-dyn", "w8a8-fp8-tensor-dyn"),
        ("w8a8-int-ch-sym-aint8", "w8a8-int-ch-sym"),
    ],
)
def test_canonical_spelling(text: str, canonical: str) -> None:
    assert parse_scheme(text).name == canonical


@pytest.mark.parametrize(
    "text,fragment",
    [
        ("w4a16-int-g100x-asym", "'g100x'"),
        ("w4a16-int-g128", "'sym' or 'asym'"),
        ("x4a16-int-g128-sym", "'x4a16'"),
        ("w4a16-foo-g128-sym", "'foo'"),
        ("w4a12-int-g128-sym", "must be 4, 8 or 16"),
        ("w5a16-int-g128-sym", "found 5"),
        ("w4a16-nvfp4-g32", "fixed block size"),
        ("w8a8-fp8-block128-static", "per-token-group"),
        ("gguf-iq2_xs", "IQ types are not supported yet"),
        ("gguf-q4_k-extra", "gguf-<type>"),
        ("w4a16-int-ch-g128-sym", "granularity given twice"),
        ("w4a16-int-g128-sym-tok", "needs quantized activations"),
        ("w4a16-int-g128-sym-sym", "symmetry given twice"),
        ("w4a16-nf4-g48", "power of two"),
        ("", "empty"),
    ],
)
def test_bad_strings_name_the_bad_part(text: str, fragment: str) -> None:
    with pytest.raises(SchemeError) as e:
        parse_scheme(text)
    assert fragment in str(e.value)


def test_invalid_field_combinations() -> None:
    with pytest.raises(SchemeError, match="act_order"):
        Scheme("int", 4, "channel", act_order=True)
    with pytest.raises(SchemeError, match="group_size"):
        Scheme("int", 4, "group", group_size=0)
    with pytest.raises(SchemeError, match="double_quant"):
        Scheme("int", 4, "group", group_size=128, double_quant=True)


def test_kv_schemes() -> None:
    for text in KV_CATALOG:
        assert parse_kv_scheme(text).name == text
    assert parse_kv_scheme("kv-fp8-head") == KVCacheScheme("fp8_e4m3", "head")
    assert parse_kv_scheme("kv-int8-tensor").name == "kv-int8"
    assert parse_kv_scheme("kv-int8-g32") == KVCacheScheme("int8", "group", 32)
    assert kv_scheme_from_name("turboquant_k3v4_nc") == TurboQuantScheme(3, 4, True)
    assert kv_scheme_from_name("int8").name == "kv-int8-token"
    assert parse_kv_scheme("kv-tq-k4v3").name == "kv-tq-k4v3"
    with pytest.raises(SchemeError, match="norm to correct"):
        TurboQuantScheme(8, 4, True)
    for bad, frag in [
        ("kv-fp4", "'fp4'"),
        ("kv-int8-chan", "'chan'"),
        ("kv-tq-5bit", "5bit"),
        ("kv-int8-g0", "positive"),
        ("cache-fp8", "kv-"),
    ]:
        with pytest.raises(SchemeError, match=frag):
            parse_kv_scheme(bad)
