"""FP8, FP4, bitsandbytes 4-bit, Quark, torchao and gpt-oss checkpoints written by the real tools
(tests/fixtures/interop, see its README "FP8, FP4 and block formats": llm-compressor +
compressed-tensors, bitsandbytes through transformers, transformers FineGrainedFP8 (on the lent
H200), AMD Quark, NVIDIA ModelOpt, torchao; gpt-oss and fbgemm_fp8 hand-built from the layout
facts because no tool here writes them). quantrt must dequantize exactly as the tool does and
run every layer through QuantLinear, as one rank or two, alone or fused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from quantrt import reference
from quantrt.checkpoint import open_checkpoint
from quantrt.errors import CheckpointError, ShardError

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "interop"


def _fp_family(p: Path) -> bool:
    layers = json.loads((p / "meta.json").read_text())["layers"]
    return "kind" in next(iter(layers.values()))


VARIANTS = sorted(p.name for p in ROOT.iterdir() if (p / "meta.json").exists() and _fp_family(p))
REFUSED = {"torchao-int4-tilepacked-g128": "float zero-points"}
#: tools whose own arithmetic rounds once more than the format's rule (named in meta.json)
ONE_ULP = {"modelopt-fp8-kvfp8"}  # ModelOpt rounds the fp32 weight_scale to bf16 before multiplying


def uncalibrated(ck: object, prefix: str) -> bool:
    """transformers' FineGrainedFP8 leaves static activation scales uninitialised (hf-fp8-tensor-static):
    quantrt refuses a non-positive one when the layer is converted."""
    e = ck.layers[prefix]  # type: ignore[attr-defined]
    name = e.tensors.get("activation_scale")
    return name is not None and float(ck.index.read(name)) <= 0  # type: ignore[attr-defined]


def meta(v: str) -> dict:
    return json.loads((ROOT / v / "meta.json").read_text())


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref.double()).norm() / ref.double().norm())


def quantized(v: str) -> dict:
    return dict(open_checkpoint(ROOT / v).weights())


def test_the_formats_are_here() -> None:
    for prefix in (
        "ct-fp8",
        "ct-nvfp4",
        "ct-mxfp4",
        "bnb4-",
        "hf-fp8",
        "modelopt-fp8",
        "modelopt-nvfp4",
        "quark-fp8",
        "quark-int4",
        "quark-uint4",
        "quark-mxfp4",
        "torchao-float8",
        "torchao-intx",
        "gptoss-mxfp4",
    ):
        assert any(v.startswith(prefix) for v in VARIANTS), prefix


@pytest.mark.parametrize("variant", VARIANTS)
def test_dequantization_equals_the_tools(variant: str) -> None:
    if variant in REFUSED:
        with pytest.raises(CheckpointError, match=REFUSED[variant]):
            quantized(variant)
        return
    m = meta(variant)
    refs = {
        k: t
        for k, t in load_file(ROOT / variant / "reference.safetensors").items()
        if not k.startswith("kv.") and not k.endswith(".dense")
    }
    ck = open_checkpoint(ROOT / variant)
    got = dict(ck.weights())
    assert set(got) == set(m["layers"]) == set(refs)
    for prefix, qw in got.items():
        if uncalibrated(ck, prefix):
            with pytest.raises(CheckpointError, match="a static activation scale must be positive"):
                qw.dequantize()
            continue
        w, ref = qw.dequantize(), refs[prefix]
        assert w.shape == ref.shape, prefix
        ours = w.to(ref.dtype)
        if variant in ONE_ULP:
            ulp = (ref.float().abs() * 2.0**-7).clamp_min(2.0**-133)
            assert bool(((ours.float() - ref.float()).abs() <= ulp).all()), prefix
        else:
            same = ours == ref
            assert bool(same.all()), f"{prefix}: {int((~same).sum())} of {same.numel()} differ"


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v not in REFUSED])
def test_every_layer_runs_through_quantlinear(variant: str) -> None:
    ck = open_checkpoint(ROOT / variant)
    g = torch.Generator().manual_seed(11)
    for prefix, qw in ck.weights():
        if ck.layers[prefix].kind == "expert":
            with pytest.raises(CheckpointError, match="MoE expert"):
                ck.linear(prefix)
            continue
        if uncalibrated(ck, prefix):
            continue
        canon = qw.canonical()
        x = torch.randn(5, qw.shape[1], generator=g)
        for act, tol in ((torch.float32, 1e-5), (torch.bfloat16, 1e-2)):
            xa = x.to(act)
            ref = reference.linear(xa.float(), canon)  # activations quantized exactly as the kernel sees them
            layer = ck.linear(prefix, act_dtype=act)
            assert rel(layer(xa), ref) < tol, (prefix, act, layer.kernel_name)


REASONS = ("not a multiple of", "flattened weight", "do not map onto whole stored elements")


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v not in REFUSED and not v.startswith("gptoss")])
def test_two_tensor_parallel_ranks(variant: str) -> None:
    ck = open_checkpoint(ROOT / variant)
    g = torch.Generator().manual_seed(5)
    split = 0
    for prefix, qw in ck.weights():
        if uncalibrated(ck, prefix):
            continue
        K = qw.shape[1]
        x = torch.randn(3, K, generator=g)
        one = ck.linear(prefix, act_dtype=torch.float32)(x)
        s = qw.scheme
        for parallel in ("column", "row"):
            try:
                ranks = [
                    ck.linear(prefix, act_dtype=torch.float32, parallel=parallel, tp_rank=r, tp_size=2)
                    for r in (0, 1)
                ]
            except ShardError as e:  # a cut through a block or a flattened layout: refused, with why
                assert any(r in str(e) for r in REASONS), str(e)
                continue
            if parallel == "column":
                y = torch.cat([r(x) for r in ranks], -1)
            else:
                y = ranks[0](x[:, : K // 2]) + ranks[1](x[:, K // 2 :])
            dynamic_acts = s.act is not None and s.act_dynamic and s.act_granularity != "token_group"
            tol = 0.05 if parallel == "row" and (dynamic_acts or s.act == "nvfp4") else 1e-5
            assert rel(y, one) < tol, (prefix, parallel)
            split += 1
    assert split > 0


@pytest.mark.parametrize(
    "variant",
    [v for v in VARIANTS if v not in REFUSED and not v.startswith("gptoss") and v != "hf-fp8-tensor-static"],
)  # its activation scales are uncalibrated
def test_fused_qkv_and_gate_up(variant: str) -> None:
    ck = open_checkpoint(ROOT / variant)
    quant = dict(ck.weights())
    g = torch.Generator().manual_seed(2)
    for names in (
        [f"model.layers.0.self_attn.{n}_proj" for n in "qkv"],
        [f"model.layers.0.mlp.{n}_proj" for n in ("gate", "up")],
    ):
        if not all(n in quant for n in names) or any(uncalibrated(ck, n) for n in names):
            continue
        x = torch.randn(4, quant[names[0]].shape[1], generator=g)
        separate = torch.cat([ck.linear(n, act_dtype=torch.float32)(x) for n in names], dim=-1)
        try:
            fused = ck.linear(names, act_dtype=torch.float32)
        except ShardError as e:  # block-scaled slices that do not start on a block boundary
            assert any(r in str(e) for r in (*REASONS, "do not line up")), str(e)
            continue
        s = quant[names[0]].scheme
        static = s.act is not None and not s.act_dynamic  # one input scale (the max) for the fused slices
        assert rel(fused(x), separate) < (0.05 if static or s.act == "nvfp4" else 1e-5), names


@pytest.mark.parametrize("variant", [v for v in VARIANTS if meta(v).get("kv_cache")])
def test_kv_cache_scales(variant: str) -> None:
    m = meta(variant)["kv_cache"]
    refs = load_file(ROOT / variant / "reference.safetensors")
    kv = open_checkpoint(ROOT / variant).kv_cache_scales()
    assert set(kv) == {"model.layers.0.self_attn"}
    got = kv["model.layers.0.self_attn"]
    assert got.scheme.name == "kv-fp8" and set(got.names) == set(m["names"])
    assert torch.equal(got.k_scale, refs["kv.model.layers.0.self_attn.k_scale"].float().reshape(-1))
    assert torch.equal(got.v_scale, refs["kv.model.layers.0.self_attn.v_scale"].float().reshape(-1))


def test_pickle_checkpoints_are_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "torchao"}}))
    (tmp_path / "pytorch_model.bin").write_bytes(b"PK\x03\x04torchao pickle")
    with pytest.raises(CheckpointError, match=r"never unpickles .* convert the checkpoint to safetensors"):
        open_checkpoint(tmp_path)
