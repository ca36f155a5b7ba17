"""Whole MoE models: quantrt's model of a checkpoint against transformers' own model of it.

- experts_int8: tiny Qwen3-MoE, Mixtral and DeepSeek-V2 (group-limited routing, shared experts)
  written by transformers' ``save_pretrained``; the oracle is transformers' model with every
  expert's weight replaced by its int8 per-channel round-to-nearest dequantization; also held
  near the dense model itself.
- gpt-oss MXFP4 (tests/fixtures/interop/gptoss-mxfp4-handbuilt): the oracle is transformers'
  own MXFP4 loader (``Mxfp4Config(dequantize=True)``), through quantrt.from_pretrained and through
  transformers' from_pretrained with QuantrtConfig.
- dense MoE checkpoints load bit-exactly (the experts stacked into transformers' own modules).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import quantrt
from quantrt import reference

transformers = pytest.importorskip("transformers")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "interop"
TINY = {
    "qwen3_moe": dict(
        hidden_size=64, intermediate_size=128, moe_intermediate_size=48, num_experts=6, num_experts_per_tok=2,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=97,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
    ),
    "mixtral": dict(
        hidden_size=64, intermediate_size=96, num_local_experts=5, num_experts_per_tok=2, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=97,
    ),
    "deepseek_v2": dict(
        hidden_size=64, intermediate_size=128, moe_intermediate_size=32, n_routed_experts=8,
        num_experts_per_tok=3, n_shared_experts=1, n_group=4, topk_group=2, topk_method="group_limited_greedy",
        routed_scaling_factor=1.5, first_k_dense_replace=1, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, vocab_size=97, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8,
        v_head_dim=16, qk_nope_head_dim=16,
    ),
}  # fmt: skip


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.fixture(scope="module", params=sorted(TINY))
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    kind = request.param
    torch.manual_seed(sorted(TINY).index(kind))
    cfg = transformers.AutoConfig.for_model(kind, **TINY[kind])
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.05)
    path = tmp_path_factory.mktemp(kind)
    model.save_pretrained(path)
    return kind, path


def prompt(vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (2, 7), generator=torch.Generator().manual_seed(seed))


def test_experts_int8_matches_transformers_with_int8_experts(tiny: tuple[str, Path]) -> None:
    kind, path = tiny
    model = quantrt.from_pretrained(
        path, device="cpu", dtype=torch.float32, quantization="experts_int8", progress=False
    )
    experts = [m for m in model.modules() if type(m).__name__ == "QuantExperts"]
    assert experts and all(
        set(m.schemes.values()) == {quantrt.parse_scheme("w8a16-int-ch-sym")} for m in experts
    )
    dense = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    oracle = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    n = 0
    with torch.no_grad():
        for name, module in oracle.named_modules():
            if not name.endswith("mlp.experts") or not hasattr(module, "gate_up_proj"):
                continue
            for pname in ("gate_up_proj", "down_proj"):
                p = getattr(module, pname)
                for e in range(p.shape[0]):
                    # quantized per projection as stored: gate and up are separate matrices
                    parts = p[e].chunk(2) if pname == "gate_up_proj" else (p[e],)
                    q = [reference.dequantize(reference.quantize(w, "w8a16-int-ch-sym")) for w in parts]
                    p[e] = torch.cat(q)
                    n += 1
    assert n
    ids = prompt(model.config.vocab_size)
    with torch.no_grad():
        got, want, plain = model(ids).logits, oracle(ids).logits, dense(ids).logits
    assert rel(got, want) < 1e-4, (kind, rel(got, want))
    assert rel(got, plain) < 2e-2, (kind, rel(got, plain))
    out = model.generate(ids[:1], max_new_tokens=4, do_sample=False)
    assert out.shape == (1, 11)


def test_dense_moe_checkpoints_load_exactly(tiny: tuple[str, Path]) -> None:
    kind, path = tiny
    model = quantrt.from_pretrained(path, device="cpu", dtype=torch.float32, progress=False)
    ref = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = prompt(model.config.vocab_size, 1)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref(ids).logits), kind


GPTOSS = FIXTURES / "gptoss-mxfp4-handbuilt"


def gptoss_oracle() -> torch.nn.Module:
    return transformers.AutoModelForCausalLM.from_pretrained(
        GPTOSS,
        device_map="cpu",
        dtype=torch.float32,
        quantization_config=transformers.Mxfp4Config(dequantize=True),
    ).eval()


@pytest.mark.parametrize("through", ["quantrt", "transformers"])
def test_gpt_oss_mxfp4_matches_transformers_mxfp4_loader(through: str) -> None:
    if through == "quantrt":
        model = quantrt.from_pretrained(GPTOSS, device="cpu", dtype=torch.float32, progress=False)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            GPTOSS, quantization_config=quantrt.QuantrtConfig(), dtype=torch.float32
        )
    experts = model.model.layers[0].mlp.experts
    assert type(experts).__name__ == "QuantExperts" and experts.act.kind == "swigluoai"
    ids = prompt(model.config.vocab_size, 2)
    with torch.no_grad():
        assert rel(model(ids).logits, gptoss_oracle()(ids).logits) < 1e-5


def test_explain_lists_moe_layers(capsys: pytest.CaptureFixture[str]) -> None:
    from quantrt.cli import main

    assert main(["explain", str(GPTOSS), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["layers"]
    moe = [r for r in rows if r.get("kind") == "experts"]
    assert [r["layer"] for r in moe] == [
        "model.layers.0.mlp.experts gate_up (2 experts)",
        "model.layers.0.mlp.experts down (2 experts)",
    ]
    assert all(r["experts"] == 2 and r["kernel"] != "reference" for r in moe)
    assert not any(
        ".experts.0." in r["layer"] for r in rows
    )  # experts are planned as one layer, not one by one


def test_a_missing_expert_is_named(tiny: tuple[str, Path], tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    _, path = tiny
    tensors = load_file(path / "model.safetensors")
    gone = next(n for n in tensors if ".experts.1." in n)
    del tensors[gone]
    for f in path.iterdir():
        if f.suffix == ".json":
            (tmp_path / f.name).write_text(f.read_text())
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(
        quantrt.CheckpointError, match=r"has experts 0, 2-\d+, expected 0\.\.\d+ \(missing 1\)"
    ):
        quantrt.from_pretrained(tmp_path, device="cpu", quantization="experts_int8", progress=False)


def _gguf_files() -> Any:
    """The helper module that writes MoE GGUF files, loaded by path (tests run in importlib mode)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "gguf_moe_files", Path(__file__).with_name("gguf_moe_files.py")
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("expert_type", ["Q8_0", "MXFP4"])
@pytest.mark.parametrize("arch", ["qwen3moe", "qwen2moe", "gpt-oss"])
def test_gguf_moe_matches_transformers_gguf_loader(arch: str, expert_type: str, tmp_path: Path) -> None:
    """GGUF MoE files written by gguf-py's writer: quantrt's model against transformers' own GGUF
    model of the file (gpt-oss's experts and sinks, which transformers' GGUF path leaves unset, filled
    from gguf-py's dequantization by the helper)."""
    pytest.importorskip("gguf")
    files = _gguf_files()
    write = {
        "qwen3moe": files.write_qwen3moe,
        "qwen2moe": files.write_qwen2moe,
        "gpt-oss": files.write_gpt_oss,
    }
    path = tmp_path / f"{arch}-{expert_type}.gguf"
    write[arch](path, expert_type=expert_type)
    model = quantrt.from_pretrained(path, device="cpu", dtype=torch.float32, progress=False)
    experts = [m for m in model.modules() if type(m).__name__ == "QuantExperts"]
    assert len(experts) == 2
    ids = prompt(model.config.vocab_size, 3)
    with torch.no_grad():
        got, want = model(ids).logits, files.transformers_model(path, dtype=torch.float32).eval()(ids).logits
    if expert_type == "MXFP4":
        assert rel(got, want) < 1e-5, rel(got, want)
        return
    # the native GGUF kernels quantize activations to 8-bit blocks, as llama.cpp does: held at 1e-2
    # against transformers, and tightly against quantrt's reference-kernel model of the same file
    from quantrt.env import Overrides

    assert rel(got, want) < 1e-2, rel(got, want)
    ref = quantrt.from_pretrained(
        path,
        device="cpu",
        dtype=torch.float32,
        progress=False,
        overrides=Overrides(backend="reference", fallback="allow"),
    )
    with torch.no_grad():
        assert rel(ref(ids).logits, want) < 1e-5
