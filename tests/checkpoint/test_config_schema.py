"""A quantization config is untrusted: a wrong type or value for a key quantrt reads, planted in a
copy of a tool-written checkpoint, is one CheckpointError naming the file, the key path, what was
expected and what was found (never a TypeError, a truncated ``int(4.7)`` or ``list("lm_head")``);
and a name pattern taken from a config is compiled once and matched in bounded time."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from fixture_edits import DOWN, ROOT, copy, edit_config, load_everything
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from quantrt.checkpoint import open_checkpoint
from quantrt.errors import CheckpointError
from quantrt.formats import patterns


def refused(d: Path, message: str, file: str = "config.json") -> None:
    """Loading ``d`` fails with exactly ``<d>/<file>: <message>``."""
    with pytest.raises(CheckpointError) as err:
        load_everything(d)
    assert str(err.value) == f"{d / file}: {message}"


def setter(path: str, value: Any) -> Callable[[dict], None]:
    """Set ``a.b.c`` (dots between keys) in a config."""

    def fn(q: dict) -> None:
        *parents, leaf = path.split(".")
        for p in parents:
            q = q[p]
        q[leaf] = value

    return fn


# variant, key path (dots), the value planted, what the message says was expected
WRONG = [
    ("gptqmodel-gptq-w4g128-asym-v2", "bits", 4.7, "an integer from 1 to 8"),
    ("gptqmodel-gptq-w4g128-asym-v2", "bits", "4", "an integer from 1 to 8"),
    ("gptqmodel-gptq-w4g128-asym-v2", "bits", True, "an integer from 1 to 8"),
    ("gptqmodel-gptq-w4g128-asym-v2", "bits", None, "an integer from 1 to 8"),
    ("gptqmodel-gptq-w4g128-asym-v2", "bits", 0, "an integer from 1 to 8"),
    ("gptqmodel-gptq-w4g128-asym-v2", "bits", [4], "an integer from 1 to 8"),
    ("gptqmodel-gptq-w4g128-asym-v2", "group_size", "128", "-1, 0 or a positive integer"),
    ("gptqmodel-gptq-w4g128-asym-v2", "group_size", -5, "-1, 0 or a positive integer"),
    ("gptqmodel-gptq-w4g128-asym-v2", "group_size", 128.0, "-1, 0 or a positive integer"),
    ("gptqmodel-gptq-w4g128-asym-v2", "sym", "false", "true or false"),
    ("gptqmodel-gptq-w4g128-asym-v2", "desc_act", 1, "true or false"),
    ("gptqmodel-gptq-w4g128-asym-v2", "checkpoint_format", 2, "a string"),
    ("gptqmodel-gptq-w4g128-asym-v2", "dynamic", ".*q_proj", "an object"),
    ("autoround-awq-w4g128-asym", "bits", "4", "an integer from 1 to 8"),
    ("autoround-awq-w4g128-asym", "group_size", None, "-1, 0 or a positive integer"),
    ("autoround-awq-w4g128-asym", "zero_point", "yes", "true or false"),
    ("autoround-awq-w4g128-asym", "version", 3, "a string"),
    ("ct-pack-w4a16-g128-sym", "ignore", "lm_head", "a list of strings"),
    ("ct-pack-w4a16-g128-sym", "ignore", ["lm_head", 7], "a list of strings"),
    ("ct-pack-w4a16-g128-sym", "format", ["pack-quantized"], "a string"),
    ("ct-pack-w4a16-g128-sym", "config_groups", ["group_0"], "an object"),
    ("ct-pack-w4a16-g128-sym", "config_groups.group_0", ["Linear"], "an object"),
    ("ct-pack-w4a16-g128-sym", "config_groups.group_0.targets", "Linear", "a list of strings"),
    ("ct-pack-w4a16-g128-sym", "config_groups.group_0.weights", 4, "an object"),
    ("ct-pack-w4a16-g128-sym", "config_groups.group_0.weights.num_bits", 4.7, "an integer from 1 to 8"),
    ("ct-pack-w4a16-g128-sym", "config_groups.group_0.weights.num_bits", 0, "an integer from 1 to 8"),
    (
        "ct-pack-w4a16-g128-sym",
        "config_groups.group_0.weights.group_size",
        "128",
        "-1, 0 or a positive integer",
    ),
    ("ct-pack-w4a16-g128-sym", "config_groups.group_0.weights.symmetric", "true", "true or false"),
    ("ct-pack-w4a16-g128-sym", "config_groups.group_0.weights.strategy", 2, "a string"),
    ("ct-pack-w4a16-g128-sym", "config_groups.group_0.weights.actorder", 1, "a string, true or false"),
    (
        "ct-int-w8a8-ch-dyntoken",
        "config_groups.group_0.input_activations.dynamic",
        2,
        'true, false or "local"',
    ),
    (
        "ct-int-w8a8-ch-dyntoken",
        "config_groups.group_0.input_activations.num_bits",
        "8",
        "an integer from 1 to 8",
    ),
    (
        "ct-fp8-w-block96x64-a16",
        "config_groups.group_0.weights.block_structure",
        [96, 0],
        'a list of two positive integers or "<rows>x<cols>"',
    ),
    (
        "ct-fp8-w-block96x64-a16",
        "config_groups.group_0.weights.block_structure",
        "96x",
        'a list of two positive integers or "<rows>x<cols>"',
    ),
    ("ct-fp8-w-channel-a-statictensor-kvfp8", "kv_cache_scheme.num_bits", "8", "an integer from 1 to 8"),
    ("bnb4-nf4", "load_in_4bit", "yes", "true or false"),
    ("bnb4-nf4", "llm_int8_skip_modules", "lm_head", "a list of strings"),
    ("bnb4-nf4", "bnb_4bit_quant_storage", 8, "a string"),
    ("bnb-int8", "load_in_8bit", 1, "true or false"),
    ("hf-fp8-block128-dyn", "weight_block_size", [128, True], "a list of two positive integers"),
    ("hf-fp8-block128-dyn", "weight_block_size", [128.0, 128.0], "a list of two positive integers"),
    ("hf-fp8-block128-dyn", "weight_block_size", 128, "a list of two positive integers"),
    ("hf-fp8-block128-dyn", "activation_scheme", ["dynamic"], "a string"),
    ("hf-fp8-block128-dyn", "modules_to_not_convert", "lm_head", "a list of strings"),
    ("hf-fp8-fbgemm-handbuilt", "activation_scale_ub", "1200", "a finite number"),
    ("hf-fp8-fbgemm-handbuilt", "modules_to_not_convert", "lm_head", "a list of strings"),
    ("modelopt-fp8-kvfp8", "quant_algo", 8, "a string"),
    ("modelopt-fp8-kvfp8", "ignore", "lm_head", "a list of strings"),
    ("modelopt-fp8-kvfp8", "kv_cache_scheme.num_bits", 8.0, "an integer from 1 to 8"),
    (
        "quark-int4-wo-g128-reorder",
        "global_quant_config.weight.group_size",
        "128",
        "-1, 0 or a positive integer",
    ),
    ("quark-int4-wo-g128-reorder", "global_quant_config.weight.dtype", 4, "a string"),
    ("quark-int4-wo-g128-reorder", "global_quant_config.weight", "int4", "an object"),
    ("quark-int4-wo-g128-reorder", "exclude", "lm_head", "a list of strings"),
    ("quark-int4-wo-g128-reorder", "export.pack_method", 1, "a string"),
    ("quark-int4-wo-g128-reorder", "layer_quant_config.*down_proj", 5, "an object"),
    (
        "quark-fp8-tensor-static-kvfp8",
        "global_quant_config.input_tensors.is_dynamic",
        "false",
        "true or false",
    ),
    ("torchao-intx-int4-g32", "quant_type", "int4_weight_only", "an object"),
    ("torchao-intx-int4-g32", "quant_type.default", "IntxWeightOnlyConfig", "an object"),
    ("torchao-intx-int4-g32", "quant_type.default._type", 1, "a string"),
    ("autoround-native-w4g128-asym", "bits", 4.5, "an integer from 1 to 8"),
    ("autoround-native-w4g128-asym", "sym", "False", "true or false"),
    ("autoround-native-w4g128-asym", "packing_format", ["auto_round"], "a string"),
    ("autoround-native-w4g128-asym", "extra_config.lm_head.bits", "16", "an integer from 1 to 64"),
    ("autoround-native-w4g128-asym", "extra_config.lm_head", 16, "an object"),
]


def _path(key: str) -> str:
    """The key path as messages write it: dotted names, [...] for names that are not identifiers."""
    out = "quantization_config"
    for part in key.split("."):
        out += f".{part}" if part.isidentifier() else f"[{part!r}]"
    return out


@pytest.mark.parametrize(("variant", "key", "value", "expected"), WRONG, ids=lambda v: str(v)[:40])
def test_a_wrong_type_or_value_is_one_clear_error(
    tmp_path: Path, variant: str, key: str, value: Any, expected: str
) -> None:
    d = copy(tmp_path, variant)
    edit_config(d, setter(key, value))
    refused(d, f"{_path(key)}: expected {expected}, found {value!r}")


def test_a_nested_list_entry_is_named_by_its_index(tmp_path: Path) -> None:
    d = copy(tmp_path, "ct-pack-w4a16-g128-sym")
    edit_config(d, setter("config_groups.group_0.targets", ["Linear", None]))
    refused(
        d,
        "quantization_config.config_groups.group_0.targets: expected a list of strings, found ['Linear', None]",
    )
    d = copy(tmp_path / "dyn", "gptqmodel-gptq-w4g128-asym-v2")
    edit_config(d, setter("dynamic", {r"+:.*\.q_proj": {"bits": "8"}}))
    refused(
        d, r"quantization_config.dynamic['+:.*\\.q_proj'].bits: expected an integer from 1 to 8, found '8'"
    )


def test_a_side_file_and_a_nested_section_are_named(tmp_path: Path) -> None:
    """hf_quant_config.json's ``quantization`` section, read when config.json has no config."""
    d = copy(tmp_path, "modelopt-fp8-kvfp8")
    cfg = json.loads((d / "config.json").read_text())
    cfg.pop("quantization_config")
    (d / "config.json").write_text(json.dumps(cfg))
    edit_config(d, setter("quantization.exclude_modules", "lm_head"), name="hf_quant_config.json")
    refused(
        d,
        "quantization_config.quantization.exclude_modules: expected a list of strings, found 'lm_head'",
        file="hf_quant_config.json",
    )


def test_values_the_readers_refuse_keep_their_reasons(tmp_path: Path) -> None:
    """In-range values a format does not allow still get the format's own message."""
    d = copy(tmp_path, "quark-int4-wo-g128-reorder")
    edit_config(d, setter("global_quant_config.weight", [{"dtype": "int4"}, {"dtype": "fp8_e4m3"}]))
    with pytest.raises(CheckpointError, match=r"a two-level Quark weight \(W4A8\) is not supported"):
        load_everything(d)
    d = copy(tmp_path / "awq", "autoround-w4g128-asym-as-awq")
    edit_config(d, setter("bits", 8))
    with pytest.raises(
        CheckpointError,
        match="packing_format auto_round:auto_awq stores 4-bit weights, the config says bits=8",
    ):
        load_everything(d)


def test_every_real_config_validates() -> None:
    """The tool-written configs of every fixture pass their schema (and so open)."""
    for p in sorted(ROOT.iterdir()):
        if (p / "meta.json").exists():
            open_checkpoint(p)


# -- patterns -----------------------------------------------------------------------------------


def rename_layer(d: Path, old: str, new: str) -> None:
    """Rename every tensor of layer ``old`` (a long name is what makes a pattern backtrack)."""
    path = d / "model.safetensors"
    with safe_open(path, "pt") as f:
        metadata = f.metadata()
    tensors = load_file(path)
    renamed = {(new + k[len(old) :] if k.startswith(old + ".") else k): v for k, v in tensors.items()}
    save_file(renamed, path, metadata=metadata)


LONG = "model.layers.0.mlp." + "a" * 40 + "_proj"


def run_load(d: Path) -> tuple[int, str, float]:
    """Load ``d`` in a fresh interpreter, bounded by a timeout: a backtracking ``re`` would hang."""
    code = textwrap.dedent(
        f"""
        from quantrt.checkpoint import open_checkpoint
        ck = open_checkpoint({str(d)!r})
        for _, qw in ck.weights():
            qw.dequantize()
        """
    )
    start = time.perf_counter()
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"loading {d.name} did not end within 120 s")
    return out.returncode, out.stderr, time.perf_counter() - start


@pytest.mark.parametrize(
    ("variant", "key", "value"),
    [
        ("ct-pack-w4a16-g128-sym", "ignore", ["lm_head", "re:.*(a+)+$"]),
        ("ct-pack-w4a16-g128-sym", "config_groups.group_0.targets", ["Linear", "re:.*(a+)+$"]),
        ("gptqmodel-gptq-w4g128-asym-v2", "dynamic", {"-:.*(a+)+$": {}}),
    ],
)
def test_a_pattern_that_backtracks_in_re_is_matched_fast(
    tmp_path: Path, variant: str, key: str, value: Any
) -> None:
    """``(a+)+$`` against a name ending in many a's takes Python's ``re`` exponential time; the
    bounded matcher answers at once, and the (non-matching) pattern changes nothing."""
    d = copy(tmp_path, variant)
    rename_layer(d, DOWN, LONG)
    edit_config(d, setter(key, value))
    rc, err, took = run_load(d)
    assert rc == 0, err
    assert took < 60


@pytest.mark.parametrize(
    ("variant", "key", "value", "where", "pattern"),
    [
        ("ct-pack-w4a16-g128-sym", "ignore", ["re:(.*?a){30}$"], "ignore", "(.*?a){30}$"),
        (
            "ct-pack-w4a16-g128-sym",
            "config_groups.group_0.targets",
            ["Linear", "re:.*(a|aa)+$"],
            "config_groups.group_0.targets",
            ".*(a|aa)+$",
        ),
        ("gptqmodel-gptq-w4g128-asym-v2", "dynamic", {"+:(.*?a){30}$": {}}, "dynamic", "(.*?a){30}$"),
    ],
)
def test_a_catastrophic_pattern_fails_fast_with_a_clear_error(
    tmp_path: Path, variant: str, key: str, value: Any, where: str, pattern: str
) -> None:
    """Patterns that backtrack exponentially even in the bounded matcher hit its timeout: one
    clear error naming the file, the key, the pattern and the layer name, within seconds."""
    d = copy(tmp_path, variant)
    rename_layer(d, DOWN, LONG)
    edit_config(d, setter(key, value))
    rc, err, took = run_load(d)
    assert rc != 0
    last = err.strip().splitlines()[-1]
    assert last.startswith("quantrt.errors.CheckpointError: "), last
    assert (
        f"{d / 'config.json'}: quantization_config.{where}: pattern {pattern!r} took over 0.5 s to match {LONG!r}"
        in last
    )
    assert took < 30, took


@pytest.mark.parametrize(
    ("variant", "key", "value", "where", "why"),
    [
        ("ct-pack-w4a16-g128-sym", "ignore", ["re:("], "ignore", "is not a valid regular expression"),
        (
            "gptqmodel-gptq-w4g128-asym-v2",
            "dynamic",
            {"+:[": {}},
            "dynamic",
            "is not a valid regular expression",
        ),
        (
            "autoround-native-w4g128-asym",
            "extra_config",
            {"(": {"bits": 8}},
            "extra_config",
            "is not a valid regular expression",
        ),
        (
            "ct-pack-w4a16-g128-sym",
            "ignore",
            ["re:" + "x" * 1001],
            "ignore",
            "is longer than the 1000 characters accepted",
        ),
        (
            "ct-pack-w4a16-g128-sym",
            "ignore",
            ["re:(?:(?:(?:a{50}){50}){50}){50}"],
            "ignore",
            "counted repeats expand to more than 10000 nodes",
        ),
        (
            "gptqmodel-gptq-w4g128-asym-v2",
            "dynamic",
            {"-:" + "(" * 60 + "a" + ")" * 60: {}},
            "dynamic",
            "groups nest deeper than 50",
        ),
        (
            "gptqmodel-gptq-w4g128-asym-v2",
            "dynamic",
            {"-:" + "(" * 600 + "a" + ")" * 600: {}},
            "dynamic",
            "is longer than",
        ),
        (
            "modelopt-fp8-kvfp8",
            "ignore",
            ["*" * 1001],
            "ignore",
            "is longer than the 1000 characters accepted",
        ),
        (
            "quark-int4-wo-g128-reorder",
            "layer_quant_config",
            {"*" * 1001: {}},
            "layer_quant_config",
            "is longer than",
        ),
    ],
    ids=lambda v: str(v)[:30],
)
def test_a_pattern_that_cannot_be_compiled_safely_is_refused(
    tmp_path: Path, variant: str, key: str, value: Any, where: str, why: str
) -> None:
    d = copy(tmp_path, variant)
    edit_config(d, setter(key, value))
    with pytest.raises(CheckpointError) as err:
        load_everything(d)
    msg = str(err.value)
    assert msg.startswith(f"{d / 'config.json'}: quantization_config.{where}: pattern "), msg
    assert why in msg, msg


def test_the_count_of_patterns_is_bounded(tmp_path: Path) -> None:
    d = copy(tmp_path, "ct-pack-w4a16-g128-sym")
    n = patterns.MAX_PATTERNS + 1
    edit_config(d, setter("ignore", [f"re:x{i}" for i in range(n)]))
    refused(d, f"quantization_config.ignore: {n} patterns; at most {patterns.MAX_PATTERNS} are accepted")


def test_patterns_keep_their_meaning() -> None:
    """Regexes match from the start (as ``re.match``), globs as fnmatch, exact names as names."""
    rules = patterns.NameRules(["lm_head", r"re:.*\.mlp\.up_proj$"], "x")
    assert rules.first("lm_head") == "lm_head"
    assert rules.first("model.layers.3.mlp.up_proj") == r"re:.*\.mlp\.up_proj$"
    assert rules.first("model.layers.3.mlp.up_proj_x") is None
    assert patterns.Pattern("layers", "x").match("layers.0") and not patterns.Pattern("0", "x").match(
        "layers.0"
    )
    glob = patterns.Pattern("model.layers.*.self_attn", "x", glob=True)
    assert glob.match("model.layers.12.self_attn") and not glob.match("model.layers.12.mlp")
    assert patterns.Pattern("a.c", "x").fullmatch("abc") and not patterns.Pattern("a", "x").fullmatch("ab")


def test_patterns_mean_what_they_mean_in_python_re() -> None:
    """The tools wrote their patterns for ``re``: a brace ``re`` reads as a literal is not a fuzzy
    match, and ``regex``-only syntax is refused rather than given another meaning."""
    fuzzy = patterns.Pattern("layers{e<=2}", "x")
    assert fuzzy.match("layers{e<=2}") and not fuzzy.match("layrs")
    assert patterns.Pattern(r"layers\.\d{1,2}\.", "x").match("layers.12.mlp")
    for text in ("(?R)", r"\p{L}+", "{3}"):
        with pytest.raises(CheckpointError, match="is not a valid regular expression"):
            patterns.Pattern(text, "x")


def test_match_time_is_budgeted_per_key() -> None:
    """Patterns just under the per-match timeout on every name still end: a key's patterns share
    a budget, and running out of it is a clear error too."""
    budget = patterns.Budget(0.0)
    p = patterns.Pattern("x", "f.json: quantization_config.ignore", budget=budget)
    with pytest.raises(
        CheckpointError, match=r"ignore: pattern 'x' used up the 60.0 s its key's patterns may spend"
    ):
        p.match("x")


def test_unknown_keys_are_kept_and_change_nothing(tmp_path: Path) -> None:
    """Real configs carry keys quantrt never reads: they pass through, whatever their type."""
    d = copy(tmp_path, "ct-pack-w4a16-g128-sym")
    edit_config(d, setter("some_future_key", {"nested": [1, 2.5, None]}))
    ck = open_checkpoint(d)
    assert ck.qconfig["some_future_key"] == {"nested": [1, 2.5, None]}
    want = dict(open_checkpoint(ROOT / d.name).weights())[DOWN].dequantize()
    assert torch.equal(dict(ck.weights())[DOWN].dequantize(), want)
