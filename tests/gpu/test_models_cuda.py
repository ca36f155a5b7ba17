"""Whole models on the GPU: a GGUF fixture and a GPTQ fixture load on CUDA with quantrt's kernels,
match the same model on the CPU reference, and decode with CUDA graphs gives eager's tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import quantrt
from quantrt.env import Overrides
from quantrt.models.generate import greedy

pytest.importorskip("transformers")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CASES = [FIXTURES / "gguf" / "tiny-llama-Q4_K_M.gguf", FIXTURES / "interop" / "gptqmodel-gptq-w4g128-asym-v2"]


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.name)
def test_cuda_model_matches_reference_and_graphs_match_eager(path: Path) -> None:
    model = quantrt.from_pretrained(path, device="cuda", dtype=torch.bfloat16, progress=False)
    assert all(k != "reference" for k in model.quantrt.plan_summary()), model.quantrt.plan_summary()
    ref = quantrt.from_pretrained(
        path, device="cpu", dtype=torch.float32, overrides=Overrides(backend="reference", fallback="allow"),
        progress=False,
    )  # fmt: skip
    ids = torch.randint(0, model.config.vocab_size, (2, 13))
    with torch.no_grad():
        got = model(ids.cuda()).logits.float().cpu()
        want = ref(ids).logits
    err = float((got - want).norm() / want.norm())
    assert err <= 3e-2, err  # bf16 activations
    prompt = ids[0].tolist()
    eager = greedy(model, prompt, 12, ignore_eos=True)
    graphs = greedy(model, prompt, 12, ignore_eos=True, cuda_graphs=True)
    assert graphs.tokens == eager.tokens
