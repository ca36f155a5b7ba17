"""Every safetensors fixture written by a real tool (tests/fixtures/interop) loads as a whole model,
through ``quantrt.from_pretrained`` and through transformers' own ``from_pretrained`` with
``QuantrtConfig``, and its logits match an oracle quantrt has no part in: transformers' Llama with
each quantized layer's weight set to the tool's own dequantization (``reference.safetensors``) and
every other tensor read by safetensors from the tool's file. Where a scheme quantizes activations
(W8A8, fp8 activations) the oracle's layer quantizes its input as the scheme says (quantrt's
reference activation quantizer, checked against its definition in tests/reference) before the
fp32 matmul with the tool's weight."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import quantrt

transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "interop"
#: fixtures quantrt refuses on purpose, each for the reason its error gives (see README's table)
REFUSED = {
    "torchao-int4-tilepacked-g128": "float zero-points",
    "hf-fp8-tensor-static": "must be positive",
}
#: MoE fixtures: their own test (tests/models/test_moe_models.py), transformers' MoE loader as the oracle
MOE = {"gptoss-mxfp4-handbuilt"}
VARIANTS = sorted(
    p.name for p in ROOT.iterdir() if (p / "meta.json").exists() and p.name not in {*REFUSED, *MOE}
)
#: rel err of the logits against the oracle: the tools' dequantization is rounded to 16 bits
TOLERANCE = 1e-2
#: for schemes that quantize activations: a rounding step that lands an activation on the other
#: side of a quantization boundary flips it by a whole step, and one layer's flips move the next
#: layer's inputs, so the kernels' and the oracle's fp32 orders of summation part by more than
#: weight-only schemes do; these are also held at TOLERANCE against quantrt's reference-kernel model
ACT_TOLERANCE = 5e-2
#: 4-bit activations (nvfp4) move by a far larger step when one flips (e2m1 steps are 1/6 of the
#: block's range, int8's 1/254)
ACT4_TOLERANCE = 1e-1


def activation_tolerance(variant: str) -> float | None:
    """The bound against the oracle for a scheme that quantizes activations (None if none does)."""
    acts = {w.scheme.act for _, w in quantrt.open_checkpoint(ROOT / variant).weights()} - {None}
    if not acts:
        return None
    return ACT4_TOLERANCE if any("fp4" in a for a in acts) else ACT_TOLERANCE


def reference_model(variant: str) -> torch.nn.Module:
    """quantrt's model of the fixture with every layer on the reference kernel (fp32 dequantize,
    then matmul; activations quantized by the reference quantizer)."""
    from quantrt.env import Overrides

    ref = Overrides(backend="reference", fallback="allow")
    return quantrt.from_pretrained(
        ROOT / variant, device="cpu", dtype=torch.float32, overrides=ref, progress=False
    )


def check_logits(variant: str, model: torch.nn.Module) -> None:
    ids = prompt(model.config.vocab_size)
    with torch.no_grad():
        got, want = model(ids).logits, oracle(variant)(ids).logits
        bound = activation_tolerance(variant)
        if bound is not None:
            assert rel(got, want) <= bound, (variant, ids.tolist(), rel(got, want))
            want = reference_model(variant)(ids).logits
    assert rel(got, want) <= TOLERANCE, (variant, ids.tolist(), rel(got, want))


def oracle(variant: str) -> torch.nn.Module:
    """transformers' own model of the fixture in fp32, with the tool's dequantized weights."""
    d = ROOT / variant
    cfg = json.loads((d / "config.json").read_text())
    cfg.pop("quantization_config", None)
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    stored = {}
    for f in sorted(d.glob("*.safetensors")):
        if f.name != "reference.safetensors":
            stored.update(load_file(f))
    deq = load_file(d / "reference.safetensors")
    state = {}
    for name in model.state_dict():
        prefix = name[: -len(".weight")] if name.endswith(".weight") else None
        if prefix in deq:
            state[name] = deq[prefix].float()
        else:
            state[name] = stored[name].float()
    model.load_state_dict(state, strict=True)
    ckpt = quantrt.open_checkpoint(d)
    for prefix, w in ckpt.weights():
        if w.scheme.act is not None:
            model.set_submodule(prefix, ActQuantLinear(model.get_submodule(prefix), w.canonical()))
    return model.eval()


class ActQuantLinear(torch.nn.Module):
    """The tool's dequantized weight behind the scheme's activation quantization."""

    def __init__(self, linear: torch.nn.Linear, canonical: quantrt.CanonicalWeight) -> None:
        super().__init__()
        self.linear, self.canonical = linear, canonical

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from quantrt.reference import quantize_activations

        xq = quantize_activations(x.reshape(-1, x.shape[-1]), self.canonical).reshape(x.shape)
        return self.linear(xq)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def prompt(vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (2, 7))


def test_variants_found() -> None:
    assert len(VARIANTS) >= 50


@pytest.mark.parametrize("variant", VARIANTS)
def test_quantrt_from_pretrained_matches_oracle(variant: str) -> None:
    model = quantrt.from_pretrained(ROOT / variant, device="cpu", dtype=torch.float32, progress=False)
    assert isinstance(model, transformers.PreTrainedModel)
    quantized = set(json.loads((ROOT / variant / "meta.json").read_text())["layers"])
    for prefix in quantized:
        assert type(model.get_submodule(prefix)).__name__ == "QuantLinear", prefix
    check_logits(variant, model)


@pytest.mark.parametrize("variant", VARIANTS)
def test_transformers_with_quantrt_config_matches_oracle(variant: str) -> None:
    from quantrt import QuantrtConfig

    model = transformers.AutoModelForCausalLM.from_pretrained(
        ROOT / variant, quantization_config=QuantrtConfig(), dtype=torch.float32
    )
    quantized = set(json.loads((ROOT / variant / "meta.json").read_text())["layers"])
    for prefix in quantized:
        assert type(model.get_submodule(prefix)).__name__ == "QuantLinear", prefix
    check_logits(variant, model)


@pytest.mark.parametrize("variant", sorted(REFUSED))
def test_refused_fixtures_say_why(variant: str) -> None:
    with pytest.raises(quantrt.CheckpointError, match=REFUSED[variant]):
        quantrt.from_pretrained(ROOT / variant, device="cpu", progress=False)
