"""Checkpoints written by the real tools (tests/fixtures/interop, see its README): quantrt finds
every layer, names its scheme, dequantizes exactly as the tool itself does, and runs each layer
through QuantLinear, as one rank or two, alone or fused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from quantrt import reference
from quantrt.checkpoint import open_checkpoint
from quantrt.errors import ShardError

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "interop"


def _integer_family(p: Path) -> bool:
    """The integer-format variants (their meta names bits per layer); test_interop_fp.py has the rest."""
    layers = json.loads((p / "meta.json").read_text())["layers"]
    return "bits" in next(iter(layers.values()))


VARIANTS = sorted(p.name for p in ROOT.iterdir() if (p / "meta.json").exists() and _integer_family(p))
FORMATS = {
    "autoround-gptq": "gptq",
    "autoround-awq": "awq",
    "autoround-native": "auto-round",
    "autoround-w4g128-asym-as-awq": "auto-round",
    "autoround-w4g128-sym-as-gptq": "auto-round",
    "bnb": "bitsandbytes",
    "ct": "compressed-tensors",
    "gptqmodel-gptq": "gptq",
    "gptqmodel-awq": "awq",
}


def meta(variant: str) -> dict:
    return json.loads((ROOT / variant / "meta.json").read_text())


def references(variant: str) -> dict[str, torch.Tensor]:
    return load_file(ROOT / variant / "reference.safetensors")


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref.double()).norm() / ref.double().norm())


def test_every_variant_is_here() -> None:
    assert len(VARIANTS) >= 25
    for prefix in (
        "autoround-gptq",
        "autoround-awq",
        "autoround-native",
        "ct-pack",
        "ct-int",
        "ct-naive",
        "gptqmodel-gptq",
        "bnb-int8",
    ):
        assert any(v.startswith(prefix) for v in VARIANTS), prefix


@pytest.mark.parametrize("variant", VARIANTS)
def test_layers_schemes_and_exact_dequantization(variant: str) -> None:
    m = meta(variant)
    ck = open_checkpoint(ROOT / variant)
    fmt = next(f for p, f in sorted(FORMATS.items(), key=lambda kv: -len(kv[0])) if variant.startswith(p))
    assert ck.format == fmt
    refs = references(variant)
    got = dict(ck.weights())
    assert set(got) == set(m["layers"]) == set(refs)
    for prefix in m["unquantized"]:
        assert not ck.layers[prefix].quantized
    for prefix, qw in got.items():
        info = m["layers"][prefix]
        s = qw.scheme
        K = qw.shape[1]
        G = info["group_size"] if info["group_size"] not in (-1, None) and info["group_size"] < K else K
        assert (s.bits, s.symmetric) == (info["bits"], info["sym"]), prefix
        assert (s.group_size or K) == G, prefix
        w = qw.dequantize()
        ref = refs[prefix]
        assert w.shape == ref.shape
        # the tool's own dequantization, value for value once rounded to the dtype it produces
        # (value equality: tools differ on the sign of an exact zero, 0 * -s)
        same = w.to(ref.dtype) == ref
        assert bool(same.all()), f"{prefix}: {int((~same).sum())} of {same.numel()} elements differ"


def test_act_order_is_real_in_the_gptqmodel_file() -> None:
    ck = open_checkpoint(ROOT / "gptqmodel-gptq-w4g128-sym-actorder")
    down = dict(ck.weights())["model.layers.0.mlp.down_proj"]
    assert down.scheme.act_order
    g = down.canonical()["g_idx"].long()
    assert not torch.equal(g, torch.arange(g.numel()) // 128)


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_layer_runs_through_quantlinear(variant: str) -> None:
    ck = open_checkpoint(ROOT / variant)
    g = torch.Generator().manual_seed(len(variant))
    for prefix, qw in ck.weights():
        canon = qw.canonical()
        x = torch.randn(5, qw.shape[1], generator=g)
        ref = reference.linear(x, canon)
        for act, tol in ((torch.float32, 1e-5), (torch.bfloat16, 1e-2)):
            layer = ck.linear(prefix, act_dtype=act)
            y = layer(x.to(act))
            assert rel(y, ref) < tol, (prefix, act, layer.kernel_name, rel(y, ref))


@pytest.mark.parametrize("variant", VARIANTS)
def test_two_tensor_parallel_ranks_equal_one(variant: str) -> None:
    ck = open_checkpoint(ROOT / variant)
    g = torch.Generator().manual_seed(7)
    checked = 0
    for prefix, qw in ck.weights():
        K = qw.shape[1]
        one = ck.linear(prefix, act_dtype=torch.float32)
        x = torch.randn(3, K, generator=g)
        y1 = one(x)
        cols = [
            ck.linear(prefix, act_dtype=torch.float32, parallel="column", tp_rank=r, tp_size=2)
            for r in (0, 1)
        ]
        assert rel(torch.cat([c(x) for c in cols], -1), y1) < 1e-5, prefix
        unit = qw.scheme.group_size if qw.scheme.granularity == "group" and not qw.scheme.act_order else 1
        if (K // 2) % unit:  # a group would straddle the cut: refused with the reason
            with pytest.raises(ShardError, match="not a multiple of"):
                ck.linear(prefix, act_dtype=torch.float32, parallel="row", tp_rank=0, tp_size=2)
            continue
        rows = [
            ck.linear(prefix, act_dtype=torch.float32, parallel="row", tp_rank=r, tp_size=2) for r in (0, 1)
        ]
        y = rows[0](x[:, : K // 2]) + rows[1](x[:, K // 2 :])
        if qw.scheme.act is not None and qw.scheme.act_dynamic:
            assert rel(y, y1) < 0.05, prefix  # each rank quantizes its own activations
        else:
            assert rel(y, y1) < 1e-5, prefix
        checked += 1
    assert checked > 0


@pytest.mark.parametrize("variant", VARIANTS)
def test_fused_layers_equal_their_shards(variant: str) -> None:
    ck = open_checkpoint(ROOT / variant)
    quant = {p: qw for p, qw in ck.weights()}
    groups = [
        [f"model.layers.0.self_attn.{n}_proj" for n in "qkv"],
        [f"model.layers.0.mlp.{n}_proj" for n in ("gate", "up")],
    ]
    fused_any = False
    g = torch.Generator().manual_seed(3)
    for names in groups:
        if not all(n in quant for n in names) or len({quant[n].scheme for n in names}) != 1:
            continue
        x = torch.randn(4, quant[names[0]].shape[1], generator=g)
        separate = torch.cat([ck.linear(n, act_dtype=torch.float32)(x) for n in names], dim=-1)
        fused = ck.linear(names, act_dtype=torch.float32)
        assert rel(fused(x), separate) < 1e-5, names
        fused_any = True
    assert fused_any or variant.startswith("ct-pack-mixed")


@pytest.mark.parametrize(
    "variant", ["autoround-gptq-w4g128-sym", "ct-pack-mixed-attn-w8ch-mlp-w4g128", "bnb-int8"]
)
def test_unquantized_layers_load_as_plain_linears(variant: str) -> None:
    ck = open_checkpoint(ROOT / variant)
    dense = (
        load_file(ROOT / variant / "model.safetensors")
        if (ROOT / variant / "model.safetensors").exists()
        else {}
    )
    for prefix in meta(variant)["unquantized"]:
        lin = ck.linear(prefix)
        w = dense[f"{prefix}.weight"]
        # the CPU backend's dense GEMV keeps a 16-bit weight as stored; else an nn.Linear in the act dtype
        assert lin.weight.dtype in (w.dtype, ck.default_act_dtype)
        assert torch.equal(lin.weight, w.to(lin.weight.dtype))
        x = torch.randn(3, w.shape[1]).to(ck.default_act_dtype)
        y = lin(x)
        ref = x.double() @ w.double().t()
        assert y.dtype == ck.default_act_dtype and (y.double() - ref).norm() / ref.norm() < 1e-2


def test_gptqmodel_dynamic_rules_apply(tmp_path: Path) -> None:
    import shutil

    d = tmp_path / "v"
    shutil.copytree(ROOT / "autoround-gptq-w4g128-sym", d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"]["dynamic"] = {r"+:.*down_proj": {"group_size": 64}}
    (d / "config.json").write_text(json.dumps(cfg))
    from quantrt.errors import CheckpointError

    with pytest.raises(
        CheckpointError, match=r"down_proj.scales: expected shape \[4, 128\], found \[2, 128\]"
    ):
        open_checkpoint(d).layers.items()
    cfg["quantization_config"]["dynamic"] = {r"-:.*down_proj": {}}
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"dynamic rule excludes model.layers.0.mlp.down_proj"):
        open_checkpoint(d).layers.items()


def test_inspect_and_explain_commands() -> None:
    import subprocess
    import sys

    path = str(ROOT / "ct-pack-mixed-attn-w8ch-mlp-w4g128")

    def run(*a):
        return subprocess.run(
            [sys.executable, "-m", "quantrt", *a],
            capture_output=True,
            text=True,
            timeout=300,
        )

    r = run("inspect", path)
    assert r.returncode == 0, r.stderr
    assert (
        "compressed-tensors" in r.stdout
        and "w8a16-int-ch-sym-sbf16" in r.stdout
        and "dense bfloat16" in r.stdout
    )
    doc = json.loads(run("inspect", path, "--json").stdout)
    rows = {x["layer"]: x for x in doc["layers"]}
    assert rows["model.layers.0.mlp.up_proj"]["scheme"] is None  # ignored by regex: dense
    assert rows["model.layers.0.mlp.down_proj"]["scheme"] == "w4a16-int-g128-asym-sbf16"
    assert rows["model.layers.0.mlp.down_proj"]["ratio"] < 0.35
    plan = json.loads(run("explain", path, "--as", "h100", "--json").stdout)
    kernels = {x["layer"]: x["kernel"] for x in plan["layers"]}
    assert kernels["model.layers.0.mlp.up_proj"] == "torch F.linear (unquantized)"
    assert all(x["candidates"] for x in plan["layers"] if x["scheme"])
    text = run("explain", path).stdout
    assert "why not, for" in text and "requires" in text
