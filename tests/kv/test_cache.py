"""The quantized KV cache under real transformers models: checkpoints whose tool wrote KV scales
(compressed-tensors, ModelOpt, Quark fixtures) run with those scales; decode steps served from the
pages equal the same model attending the dequantized cache through transformers' own sdpa; a
Gemma-3 shaped model with a small sliding window exercises windowed layers; and ``quantrt run
--kv-cache`` reports the cache it used."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import quantrt
from quantrt.kv import kv_cache
from quantrt.kv.cache import QuantKVCache, QuantKVLayer
from quantrt.schemes import parse_kv_scheme

transformers = pytest.importorskip("transformers")
from transformers import DynamicCache  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "interop"
KV_FIXTURES = [
    "ct-fp8-w-channel-a-statictensor-kvfp8",
    "modelopt-fp8-kvfp8",
    "quark-fp8-tensor-static-kvfp8",
]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@torch.inference_mode()
def _walk(model, cache, ids: torch.Tensor, prompt: int) -> torch.Tensor:
    """Logits of each step: the prompt prefilled, then one token at a time."""
    out = [model(input_ids=ids[:, :prompt], cache=cache, use_cache=True).logits[:, -1]]
    for i in range(prompt, ids.shape[1]):
        out.append(model(input_ids=ids[:, i : i + 1], cache=cache, use_cache=True).logits[:, -1])
    return torch.stack(out, 1).float()


@pytest.mark.parametrize("name", KV_FIXTURES)
def test_checkpoint_scales_drive_the_cache(name: str) -> None:
    from safetensors.torch import load_file

    model = quantrt.from_pretrained(FIXTURES / name, device="cpu", dtype=torch.float32, progress=False)
    scales = model.quantrt.kv_scales
    assert set(scales) == {0} and scales[0].scheme == parse_kv_scheme("kv-fp8")
    assert model.quantrt.to_json()["kv_cache_scales"] == {"0": "kv-fp8"}
    assert not [n for n in model.quantrt.ignored if n in scales[0].names]  # read, not ignored
    refs = load_file(FIXTURES / name / "reference.safetensors")
    cache = kv_cache(model, "auto")
    assert isinstance(cache, QuantKVCache) and str(cache.scheme) == "kv-fp8"
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (2, 14), generator=g)
    fused = _walk(model, cache, ids, 6)
    pages = cache.layers[0].pages
    assert torch.equal(pages.k_scale, refs["kv.model.layers.0.self_attn.k_scale"].float().reshape(-1))
    assert torch.equal(pages.v_scale, refs["kv.model.layers.0.self_attn.v_scale"].float().reshape(-1))
    # the same cache contents attended by transformers' sdpa over the dequantized pages
    plain = _walk(model, kv_cache(model, "auto", fused=False), ids, 6)
    assert torch.equal(fused[:, 0], plain[:, 0])
    # the W8A8 layers quantize their inputs: a last-bit difference in attention can move one code
    assert rel(fused, plain) < 1e-2
    exact = _walk(model, DynamicCache(config=model.config), ids, 6)
    assert torch.equal(fused[:, 0], exact[:, 0])  # the first prefill attends the keys as computed
    assert rel(fused, exact) < 0.05


def _tiny_gemma3() -> torch.nn.Module:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    cfg = Gemma3TextConfig(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, sliding_window=5, max_position_embeddings=256,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(0)
    return Gemma3ForCausalLM(cfg).eval()


@pytest.mark.parametrize("scheme", ["kv-fp8", "kv-int8-token", "kv-tq-4bit-nc", "kv-tq-k8v4"])
def test_sliding_window_model_decodes_from_pages(scheme: str) -> None:
    model = _tiny_gemma3()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 96, (2, 24), generator=g)
    fused = _walk(model, kv_cache(model, scheme, protect=0), ids, 4)
    plain = _walk(model, kv_cache(model, scheme, protect=0, fused=False), ids, 4)
    # 20 decode steps, most past the window of 5. The two paths round attention differently, and a
    # last-bit difference can move one code of a later layer's write: a quantization step of one
    # token's channel, about 1e-5 of the logits (int8 per token, transformers 5.25); a wrong window
    # or page is 1e-2 and more
    assert rel(fused, plain) < 1e-4
    exact = _walk(model, DynamicCache(config=model.config), ids, 4)
    print(f"{scheme}: logits rel err vs the unquantized cache {rel(fused, exact):.4f}")
    assert rel(fused, exact) < (0.05 if "tq" not in scheme else 0.2)


def test_unquantized_pages_equal_transformers_cache() -> None:
    model = _tiny_gemma3()
    ids = torch.randint(0, 96, (1, 20), generator=torch.Generator().manual_seed(2))
    exact = _walk(model, DynamicCache(config=model.config), ids, 3)
    ours = kv_cache(model, "paged")  # the public name: unquantized pages, quantrt's attention
    assert isinstance(ours, QuantKVCache) and [layer.scheme for layer in ours.layers] == [None] * 4
    assert ours.describe()["scheme"] == "unquantized"
    assert rel(_walk(model, ours, ids, 3), exact) < 1e-5
    by_hand = QuantKVCache([QuantKVLayer(None) for _ in range(4)], None)
    assert rel(_walk(model, by_hand, ids, 3), exact) < 1e-5


def test_generate_and_greedy_take_the_cache() -> None:
    from quantrt.models.generate import greedy

    model = _tiny_gemma3()
    prompt = [5, 9, 17, 3]
    cache = kv_cache(model, "fp8")
    out = model.generate(torch.tensor([prompt]), cache=cache, max_new_tokens=8, do_sample=False)
    gen = greedy(model, prompt, 8, ignore_eos=True, kv_cache="fp8")
    assert gen.kv_cache is not None and gen.kv_cache["scheme"] == "kv-fp8" and gen.kv_cache["bytes"] > 0
    assert out[0, len(prompt) :].tolist() == gen.new
    assert cache.get_seq_length() == len(prompt) + 7
    tq = kv_cache(model, "turboquant_3bit_nc")
    assert [str(layer.scheme) for layer in tq.layers] == ["None"] * 4  # boundary protection: 2 + 2 of 4
    assert kv_cache(model, "none") is None and kv_cache(model, "auto") is None


def test_refusals() -> None:
    model = _tiny_gemma3()
    with pytest.raises(quantrt.QuantrtError, match="unknown KV-cache type"):
        kv_cache(model, "kv-fp4")
    with pytest.raises(quantrt.QuantrtError, match="multiple of the group size"):
        kv_cache(model, "kv-int8-g24")


def test_cli_run_reports_the_cache(tmp_path: Path) -> None:
    path = FIXTURES / KV_FIXTURES[0]
    cmd = [
        sys.executable,
        "-m",
        "quantrt",
        "run",
        str(path),
        "--prompt-ids",
        "1,5,7,9",
        "--max-new-tokens",
        "4",
    ]
    cmd += ["--device", "cpu", "--json", "--quiet"]
    out = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    assert out["kv_cache"]["scheme"] == "kv-fp8" and out["kv_cache"]["layers"] == {"kv-fp8": 1}
    none = json.loads(
        subprocess.run([*cmd, "--kv-cache", "none"], capture_output=True, text=True, check=True).stdout
    )
    assert none["kv_cache"] is None and len(none["token_ids"]) == 8
