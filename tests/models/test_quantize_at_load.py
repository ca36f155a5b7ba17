"""A dense checkpoint quantized at load (``from_pretrained(path, quantize=...)``, ``quantrt run
--quantize``): every linear layer but the output head and MoE routers takes the scheme, the
model's logits equal transformers' own model with each of those weights replaced by the reference
quantizer's round trip, overrides and skips apply by name, and what cannot be done is refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import quantrt
from quantrt import reference
from quantrt.errors import CheckpointError, ConfigError
from quantrt.formats.online import OnlineQuantization
from quantrt.layers import QuantLinear

transformers = pytest.importorskip("transformers")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "interop"
TINY = {
    "llama": dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=97, tie_word_embeddings=False,
    ),
    "qwen3_moe": dict(
        hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=97,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
    ),
}  # fmt: skip


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.fixture(scope="module", params=sorted(TINY))
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    kind = request.param
    torch.manual_seed(11 + sorted(TINY).index(kind))
    cfg = transformers.AutoConfig.for_model(kind, **TINY[kind])
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.05)
    path = tmp_path_factory.mktemp(kind)
    model.save_pretrained(path)
    return kind, path


def _round_trip(w: torch.Tensor, scheme: str, search: str | None = None) -> torch.Tensor:
    return reference.dequantize(reference.quantize(w, scheme, search=search)).to(w.dtype)


class _Reference(torch.nn.Module):
    """A linear layer as the fp32 reference computes its quantized scheme (activations too)."""

    def __init__(self, linear: torch.nn.Linear, scheme: str, search: str | None = None) -> None:
        super().__init__()
        self.canon = reference.quantize(linear.weight.detach(), scheme, search=search)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = reference.linear(x.reshape(-1, x.shape[-1]), self.canon, self.bias, out_dtype=torch.float32)
        return y.reshape(*x.shape[:-1], -1)


def _oracle(path: Path, scheme: str, search: str | None = None) -> torch.nn.Module:
    """transformers' model with every linear layer but the head and the routers computed by the
    reference on the scheme's quantized weight (experts: each projection's weight round trip)."""
    oracle = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, m in list(oracle.named_modules()):
            if isinstance(m, torch.nn.Linear) and name != "lm_head" and not name.endswith("mlp.gate"):
                oracle.set_submodule(name, _Reference(m, scheme, search))
            if name.endswith("mlp.experts") and hasattr(m, "gate_up_proj"):
                for pname in ("gate_up_proj", "down_proj"):
                    p = getattr(m, pname)
                    for e in range(p.shape[0]):
                        parts = p[e].chunk(2) if pname == "gate_up_proj" else (p[e],)
                        p[e] = torch.cat([_round_trip(w, scheme, search) for w in parts])
    return oracle


@pytest.mark.parametrize("scheme", ["w4a16-int-g32-asym", "w8a16-int-ch-sym", "w8a8-fp8-ch"])
def test_logits_equal_the_reference_round_trip(tiny: tuple[str, Path], scheme: str) -> None:
    kind, path = tiny
    if kind == "qwen3_moe" and "a16" not in scheme:
        pytest.skip("the experts' oracle is a weight round trip: weight-only schemes")
    model = quantrt.from_pretrained(path, device="cpu", dtype=torch.float32, quantize=scheme, progress=False)
    linears = {n: m for n, m in model.named_modules() if isinstance(m, QuantLinear)}
    assert linears and all(m.scheme == quantrt.parse_scheme(scheme) for m in linears.values())
    assert isinstance(model.lm_head, torch.nn.Linear) and not isinstance(model.lm_head, QuantLinear)
    assert not [n for n in linears if n.endswith("mlp.gate")]  # routers stay dense
    if kind == "qwen3_moe":
        experts = [m for m in model.modules() if type(m).__name__ == "QuantExperts"]
        assert experts and all(set(m.schemes.values()) == {quantrt.parse_scheme(scheme)} for m in experts)
    assert model.quantrt.format == "quantrt_online"
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(3))
    oracle = _oracle(path, scheme)
    dense = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        got, want, plain = model(ids).logits, oracle(ids).logits, dense(ids).logits
    assert rel(got, want) < 1e-4, (kind, scheme, rel(got, want))
    assert 0 < rel(got, plain) < 0.3, (kind, scheme, rel(got, plain))  # int4 on random weights: ~0.13


def test_overrides_and_skips_by_name(tiny: tuple[str, Path]) -> None:
    kind, path = tiny
    if kind != "llama":
        pytest.skip("names of the dense model suffice")
    spec = OnlineQuantization(
        "w8a16-int-ch-sym",
        overrides={"*.down_proj": "w4a16-int-g32-sym", "*.layers.1.self_attn.o_proj": None},
        skip=("*.up_proj",),
    )
    model = quantrt.from_pretrained(path, device="cpu", dtype=torch.float32, quantize=spec, progress=False)
    mods = dict(model.named_modules())
    assert mods["model.layers.0.mlp.down_proj"].scheme == quantrt.parse_scheme("w4a16-int-g32-sym")
    assert mods["model.layers.0.self_attn.o_proj"].scheme == quantrt.parse_scheme("w8a16-int-ch-sym")
    assert not isinstance(mods["model.layers.1.self_attn.o_proj"], QuantLinear)  # override None: dense
    assert type(model.lm_head) is QuantLinear  # a skip list given: the default one no longer applies
    assert type(mods["model.layers.0.mlp.up_proj"]) is torch.nn.Linear  # skipped: dense
    assert mods["model.layers.0.mlp.gate_proj"].scheme == quantrt.parse_scheme("w8a16-int-ch-sym")
    ids = torch.randint(0, 97, (1, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.isfinite(model(ids).logits).all()


def test_refusals(tiny: tuple[str, Path]) -> None:
    kind, path = tiny
    if kind != "llama":
        pytest.skip("one checkpoint suffices")
    load = dict(device="cpu", dtype=torch.float32, progress=False)
    with pytest.raises(CheckpointError, match="w5a16-nonsense"):
        quantrt.from_pretrained(path, quantize="w5a16-nonsense", **load)
    with pytest.raises(CheckpointError, match="calibrated activation scales"):
        quantrt.from_pretrained(path, quantize="w8a8-fp8-tensor-static", **load)
    with pytest.raises(ConfigError, match="give one of them"):
        quantrt.from_pretrained(path, quantize="w8a16-int-ch-sym", quantization="experts_int8", **load)
    with pytest.raises(CheckpointError, match="quantized already"):
        quantrt.from_pretrained(FIXTURES / "ct-pack-w8a16-ch-sym", quantize="w8a16-int-ch-sym", **load)


def test_cli_run_quantize(tiny: tuple[str, Path]) -> None:
    kind, path = tiny
    if kind != "llama":
        pytest.skip("one checkpoint suffices")
    cmd = [
        sys.executable,
        "-m",
        "quantrt",
        "run",
        str(path),
        "--prompt-ids",
        "3,5,7",
        "--max-new-tokens",
        "3",
    ]
    cmd += ["--quantize", "w4a16-int-g32-asym", "--quantize-search", "mse"]
    cmd += ["--device", "cpu", "--dtype", "fp32", "--check", "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd="/tmp", timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)
    assert doc["quantized_at_load"] == "w4a16-int-g32-asym" and doc["check"]["ok"], doc["check"]
    assert doc["new_tokens"] == 3 and doc["format"] == "quantrt_online"


@pytest.mark.parametrize("scheme", ["w4a16-int-g32-asym", "w8a16-int-ch-sym", "w8a8-fp8-ch", "gguf-q4_k"])
def test_row_chunks_quantize_to_the_whole_layers_codes(scheme: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Quantized a chunk of rows at a time (peak memory), a layer gets the codes of the whole."""
    from quantrt.formats import online

    monkeypatch.setattr(online, "CHUNK_ROWS", 48)
    w = torch.randn(200, 256, generator=torch.Generator().manual_seed(4)).bfloat16()
    s = quantrt.parse_scheme(scheme)
    got = online.OnlineAdapter(torch.bfloat16).to_canonical({"weight": w}, s, 200, 256, (200,))
    want = reference.quantize(w, s)
    assert got.tensors.keys() == want.tensors.keys()
    assert all(torch.equal(got[k], want[k]) for k in want.tensors), scheme


def test_non_finite_weight_is_refused_with_its_layer(tmp_path: Path) -> None:
    """The finiteness check runs where the layer is quantized (on its device); it still names it."""
    from safetensors.torch import load_file, save_file

    cfg = transformers.AutoConfig.for_model("llama", **TINY["llama"])
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path)
    (f,) = tmp_path.glob("*.safetensors")
    tensors = load_file(f)
    tensors["model.layers.1.mlp.down_proj.weight"][3, 5] = float("nan")
    save_file(tensors, str(f), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"model\.layers\.1\.mlp\.down_proj.*1 of 6144 values are NaN"):
        quantrt.from_pretrained(tmp_path, quantize="w4a16-int-g32-sym", device="cpu", progress=False)


def test_mse_search_at_load(tiny: tuple[str, Path]) -> None:
    """``OnlineQuantization(search="mse")``: every layer (experts too) takes the searched codes."""
    _, path = tiny
    spec = OnlineQuantization("w4a16-int-g32-asym", search="mse")
    model = quantrt.from_pretrained(path, device="cpu", dtype=torch.float32, quantize=spec, progress=False)
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        got = model(ids).logits
        want = _oracle(path, "w4a16-int-g32-asym", "mse")(ids).logits
        plain = _oracle(path, "w4a16-int-g32-asym")(ids).logits
    assert rel(got, want) < 1e-4, rel(got, want)
    assert rel(plain, want) > 1e-3  # the search changed the codes
