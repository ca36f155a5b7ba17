"""A tiny Qwen3-MoE quantized by the real compressed-tensors library (tests/fixtures/interop_moe,
written with transformers 4.57, whose experts are nn.Linear modules compressed-tensors can
quantize): attention and every expert's gate/up/down projection quantized, router and lm_head
dense.

For every variant:
(a) quantrt's dequantization of every quantized layer equals compressed-tensors' own
    (``reference.safetensors``) bit for bit;
(b) ``open_checkpoint(v).experts`` groups the per-expert layers into one MoE layer per decoder layer,
    4 experts, every projection in the variant's scheme;
(c) ``quantrt.from_pretrained`` builds ``QuantExperts`` and its logits match an oracle quantrt has no
    part in: transformers 5's own Qwen3-MoE built from the config, every quantized weight set to the
    tool's dequantization (the experts stacked into ``mlp.experts.gate_up_proj[e] = cat(gate, up)``
    and ``down_proj[e]``), every other tensor read by safetensors from the tool's file. Where the
    scheme quantizes activations, the oracle's attention linears and each expert projection quantize
    their input as the scheme says (quantrt's reference activation quantizer, the one
    tests/models/test_fixture_models.py uses for dense layers; checked against its definition in
    tests/reference) before the fp32 matmul with the tool's weight, inside an experts forward of its
    own (routing by transformers' router, as transformers' experts forward does).
    compressed-tensors rounds its dequantized weights to bf16 and quantrt does not, so the logits are
    held loosely against that oracle and tightly (fp32 summation order only) against the same oracle
    built with the exact fp32 products (whose bf16 rounding is the tool's, bit for bit, by (a));
(d) transformers' own ``from_pretrained`` with ``QuantrtConfig`` gives the same logits.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import quantrt

transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "interop_moe"
#: this file's variants (compressed-tensors); test_interop_moe_more.py tests the others ("test": "more")
VARIANTS = sorted(
    p.name
    for p in ROOT.iterdir()
    if (p / "meta.json").exists() and json.loads((p / "meta.json").read_text()).get("test") != "more"
)
#: the scheme of every quantized layer (attention and experts alike), as quantrt names it
SCHEMES = {
    "ct-moe-w4a16-g32-asym": "w4a16-int-g32-asym-sbf16",
    "ct-moe-w8a8-fp8-dyntoken": "w8a8-fp8-ch-sbf16",
    "ct-moe-fp8-block128": "w8a8-fp8-block128-sbf16",
    "ct-moe-nvfp4": "w4a4-nvfp4",
    "ct-moe-nvfp4a16": "w4a16-nvfp4",
    "ct-moe-w8a8-int8": "w8a8-int-ch-sym-sbf16",
}
E = 4
PROJ = ("gate_proj", "up_proj", "down_proj")
#: rel err of the logits against the oracle with the tool's weights. compressed-tensors rounds every
#: dequantized weight to bf16 (the model's dtype); quantrt keeps the exact fp32 product (which rounds
#: to the tool's bf16 bit for bit, test (a)), so the two models differ by that rounding: 1.9e-3 to
#: 2.4e-3 measured on the weight-only variants
TOLERANCE = 1e-2
#: where activations are quantized too, that weight rounding moves activations across quantization
#: boundaries (a whole step: 1/254 of the range for int8, an fp8 e4m3 mantissa step, 1/6 of a block's
#: range for e2m1), and the flips spread to the next layers: measured 5.0e-3..6.6e-3 (int8),
#: 1.1e-2..1.4e-2 (fp8 channel and block), 3.1e-2..3.8e-2 (nvfp4)
ACT_TOLERANCE = {"int8": 5e-2, "fp8_e4m3": 5e-2, "nvfp4": 1e-1}
#: against the same oracle with the exact fp32 weights, only the order of fp32 summation differs
#: (measured <= 5.7e-7); with quantized activations one rounding can still flip (8.5e-6 measured)
TIGHT = {None: 1e-5, "int8": 1e-4, "fp8_e4m3": 1e-4, "nvfp4": 1e-4}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def prompt(vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, vocab, (2, 9), generator=torch.Generator().manual_seed(seed))


def meta(v: str) -> dict:
    return json.loads((ROOT / v / "meta.json").read_text())


def references(v: str) -> dict[str, torch.Tensor]:
    return load_file(ROOT / v / "reference.safetensors")


def test_the_variants_are_here() -> None:
    assert VARIANTS == sorted(SCHEMES)
    total = sum(f.stat().st_size for v in VARIANTS for f in (ROOT / v).rglob("*") if f.is_file())
    assert total < 6 << 20, total


# -- (a) dequantization ---------------------------------------------------------------------------
def assert_dequantization_equals_the_tool(variant: str) -> dict[str, quantrt.QuantizedWeight]:
    """Every quantized layer of ``variant`` dequantizes to the tool's own reference, bit for bit
    (the tools return bf16, fp16 or fp32; quantrt's fp32 value rounds to it exactly when it is the
    same product: no variant needs slack). Shared with test_interop_moe_more.py."""
    refs = references(variant)
    got = dict(quantrt.open_checkpoint(ROOT / variant).weights())
    assert set(got) == set(refs) == set(meta(variant)["layers"])
    for prefix, qw in got.items():
        ref = refs[prefix]
        w = qw.dequantize()
        assert w.shape == ref.shape, prefix
        same = w.to(ref.dtype) == ref
        assert bool(same.all()), f"{prefix}: {int((~same).sum())} of {same.numel()} differ"
    return got


def assert_experts_grouped(variant: str, want: quantrt.Scheme) -> None:
    """One MoE layer per decoder layer, E experts, every projection in ``want``."""
    ck = quantrt.open_checkpoint(ROOT / variant)
    cfg = json.loads((ROOT / variant / "config.json").read_text())
    assert list(ck.experts) == [f"model.layers.{i}.mlp.experts" for i in range(cfg["num_hidden_layers"])]
    for entry in ck.experts.values():
        assert entry.num_experts == E and not entry.fused and entry.quantized
        assert (entry.hidden_size, entry.intermediate_size) == (
            cfg["hidden_size"],
            cfg["moe_intermediate_size"],
        )
        for proj in ("gate", "up", "down"):
            assert entry.scheme(proj) == want, (proj, entry.scheme(proj))
            assert sorted(entry.projections[proj]) == list(range(E))
    assert ck.expert_prefixes() == {p for p in ck.layers if ".mlp.experts." in p}


@pytest.mark.parametrize("variant", VARIANTS)
def test_dequantization_equals_compressed_tensors(variant: str) -> None:
    got = assert_dequantization_equals_the_tool(variant)
    assert sum(".mlp.experts." in p for p in got) == 3 * E


# -- (b) the MoE layers of the checkpoint -----------------------------------------------------------
@pytest.mark.parametrize("variant", VARIANTS)
def test_experts_are_grouped_per_decoder_layer(variant: str) -> None:
    want = quantrt.parse_scheme(SCHEMES[variant])
    assert_experts_grouped(variant, want)
    for prefix, qw in quantrt.open_checkpoint(ROOT / variant).weights():
        assert qw.scheme == want, prefix


# -- (c), (d) the whole model -----------------------------------------------------------------------
class ActQuantLinear(torch.nn.Module):
    """The tool's dequantized weight behind the scheme's activation quantization."""

    def __init__(self, linear: torch.nn.Linear, canonical: quantrt.CanonicalWeight) -> None:
        super().__init__()
        self.linear, self.canonical = linear, canonical

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from quantrt.reference import quantize_activations

        xq = quantize_activations(x.reshape(-1, x.shape[-1]), self.canonical).reshape(x.shape)
        return self.linear(xq)


class ActQuantExperts(torch.nn.Module):
    """transformers' experts forward (top-k routing given), each expert projection's input
    quantized by its own scheme and scales before the fp32 matmul with the tool's weight."""

    def __init__(
        self, experts: torch.nn.Module, canonical: dict[tuple[int, str], quantrt.CanonicalWeight]
    ) -> None:
        super().__init__()
        self.gate_up, self.down, self.canonical = experts.gate_up_proj, experts.down_proj, canonical

    def forward(
        self, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        from quantrt.reference import quantize_activations

        out = torch.zeros_like(hidden)
        inter = self.down.shape[-1]
        for e in range(self.down.shape[0]):
            tok, pos = torch.where(top_k_index == e)
            if tok.numel() == 0:
                continue
            x = hidden[tok]
            gate = quantize_activations(x, self.canonical[e, "gate_proj"]) @ self.gate_up[e, :inter].T
            up = quantize_activations(x, self.canonical[e, "up_proj"]) @ self.gate_up[e, inter:].T
            h = torch.nn.functional.silu(gate) * up
            y = quantize_activations(h, self.canonical[e, "down_proj"]) @ self.down[e].T
            out.index_add_(0, tok, y * top_k_weights[tok, pos, None])
        return out


def oracle(variant: str, weights: str = "tool") -> torch.nn.Module:
    """transformers 5's Qwen3-MoE in fp32 with compressed-tensors' dequantized weights (``weights="tool"``),
    or with quantrt's fp32 dequantization of each layer (``"quantrt-fp32"``: the exact products the
    tool rounds to bf16, see test_dequantization_equals_compressed_tensors)."""
    d = ROOT / variant
    cfg = json.loads((d / "config.json").read_text())
    cfg.pop("quantization_config")
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    stored = load_file(d / "model.safetensors")
    if weights == "tool":
        deq = {p: w.float() for p, w in references(variant).items()}
    else:
        deq = {p: w.dequantize() for p, w in quantrt.open_checkpoint(d).weights()}
    state = {}
    for name in model.state_dict():
        base = name.rsplit(".", 1)[0]
        if name.endswith("mlp.experts.gate_up_proj"):
            state[name] = torch.stack(
                [torch.cat([deq[f"{base}.{e}.gate_proj"], deq[f"{base}.{e}.up_proj"]]) for e in range(E)]
            )
        elif name.endswith("mlp.experts.down_proj"):
            state[name] = torch.stack([deq[f"{base}.{e}.down_proj"] for e in range(E)])
        elif name.endswith(".weight") and base in deq:
            state[name] = deq[base]
        else:
            state[name] = stored[name].float()
    model.load_state_dict(state, strict=True)
    ck = quantrt.open_checkpoint(d)
    canon = {p: w.canonical() for p, w in ck.weights() if w.scheme.act is not None}
    for prefix, c in canon.items():
        if ".mlp.experts." not in prefix:
            model.set_submodule(prefix, ActQuantLinear(model.get_submodule(prefix), c))
    for moe in ck.experts:
        if any(p.startswith(moe + ".") for p in canon):
            experts = model.get_submodule(moe)
            per = {(e, proj): canon[f"{moe}.{e}.{proj}"] for e in range(E) for proj in PROJ}
            model.set_submodule(moe, ActQuantExperts(experts, per))
    return model.eval()


def reference_model(variant: str) -> torch.nn.Module:
    """quantrt's model of the fixture with every layer on the reference kernel."""
    from quantrt.env import Overrides

    ref = Overrides(backend="reference", fallback="allow")
    return quantrt.from_pretrained(
        ROOT / variant, device="cpu", dtype=torch.float32, overrides=ref, progress=False
    )


def check_model(variant: str, model: torch.nn.Module) -> None:
    experts = [m for n, m in model.named_modules() if n.endswith("mlp.experts")]
    assert experts and all(type(m).__name__ == "QuantExperts" for m in experts), [type(m) for m in experts]
    want = quantrt.parse_scheme(SCHEMES[variant])
    for m in experts:
        assert set(m.schemes.values()) == {want} and m.num_experts == E
    for prefix in meta(variant)["layers"]:
        if ".mlp.experts." not in prefix:
            assert type(model.get_submodule(prefix)).__name__ == "QuantLinear", prefix
    tool, exact = oracle(variant), oracle(variant, "quantrt-fp32")
    ref = reference_model(variant) if want.act is not None else None
    loose = TOLERANCE if want.act is None else ACT_TOLERANCE[want.act]
    for seed in range(3):
        ids = prompt(model.config.vocab_size, seed)
        with torch.no_grad():
            got = model(ids).logits
            a, b = rel(got, tool(ids).logits), rel(got, exact(ids).logits)
            assert a <= loose, (variant, seed, "vs the oracle with compressed-tensors' weights", a)
            assert b <= TIGHT[want.act], (variant, seed, "vs the oracle with the exact fp32 weights", b)
            if ref is not None:
                c = rel(got, ref(ids).logits)
                assert c <= TIGHT[want.act], (variant, seed, "vs quantrt's reference-kernel model", c)


@pytest.mark.parametrize("variant", VARIANTS)
def test_quantrt_from_pretrained_matches_oracle(variant: str) -> None:
    model = quantrt.from_pretrained(ROOT / variant, device="cpu", dtype=torch.float32, progress=False)
    assert isinstance(model, transformers.PreTrainedModel)
    check_model(variant, model)


@pytest.mark.parametrize("variant", VARIANTS)
def test_transformers_with_quantrt_config_matches_oracle(variant: str) -> None:
    model = transformers.AutoModelForCausalLM.from_pretrained(
        ROOT / variant, quantization_config=quantrt.QuantrtConfig(), dtype=torch.float32
    )
    check_model(variant, model)
