"""Tensor parallelism for real: two processes (torch.distributed, gloo, CPU) each load their half of
a checkpoint (column-parallel q/k/v/gate/up, row-parallel o/down with quantrt's all-reduce, the
output projection gathered; an MoE model's experts cut the same way inside QuantExperts) and their
logits must equal the single-process model's.

The GGUF file's layers run on ``cpu.native_gguf``, which quantizes activations per 32-wide block:
a row-parallel rank's half of K starts on a block boundary, so each rank quantizes the same blocks
the whole layer would, and the two sides differ only by the order of the final sum. The
safetensors fixture has one key/value head for two ranks, so each rank holds a replica of it.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import quantrt

pytest.importorskip("transformers")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CASES = {
    "gguf-q8_0": FIXTURES / "gguf" / "tiny-llama-Q8_0.gguf",
    "gguf-q4_0": FIXTURES / "gguf" / "tiny-llama-Q4_0.gguf",
    "gptq-kv-replicated": FIXTURES / "interop" / "gptqmodel-gptq-w4g128-asym-v2",
    # a Qwen3-MoE by compressed-tensors: each rank holds half of every expert (gate/up by columns of
    # I, down by rows) and QuantExperts sums the ranks' outputs
    "moe-int4": FIXTURES / "interop_moe" / "ct-moe-w4a16-g32-asym",
}
WORLD = 2
#: the GGUF kernels quantize each layer's input to 8-bit blocks: a row-parallel layer's sum, added
#: up in another order across ranks, can differ in its last bit and move one code of the next
#: layer's input by a step; weight-only kernels (gptq) see only the summation order
TOLERANCE = {"gguf-q8_0": 2e-3, "gguf-q4_0": 2e-3, "gptq-kv-replicated": 1e-5, "moe-int4": 1e-5}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, path: str, ids: torch.Tensor, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        model = quantrt.from_pretrained(path, device="cpu", dtype=torch.float32, tp=WORLD, progress=False)
        kinds = {n: type(m).__name__ for n, m in model.named_modules()}
        with torch.no_grad():
            logits = model(ids).logits
        torch.save({"logits": logits, "kinds": kinds, "config": model.config.to_dict()}, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("case", sorted(CASES))
def test_two_ranks_equal_one(case: str, tmp_path: Path) -> None:
    path = CASES[case]
    if not path.exists():
        pytest.skip(f"fixture {path} is missing")
    torch.set_num_threads(1)
    single = quantrt.from_pretrained(path, device="cpu", dtype=torch.float32, progress=False)
    ids = torch.randint(0, single.config.vocab_size, (2, 11))
    with torch.no_grad():
        want = single(ids).logits
    out = str(tmp_path / "rank")
    mp.start_processes(_rank, args=(_free_port(), str(path), ids, out), nprocs=WORLD, start_method="spawn")
    heads = single.config.num_attention_heads
    for r in range(WORLD):
        got = torch.load(f"{out}.{r}", weights_only=True)
        assert got["config"]["num_attention_heads"] == heads // WORLD  # each rank runs half the heads
        assert got["kinds"]["model.layers.0.self_attn.o_proj"] == "RowParallel"
        assert got["kinds"]["lm_head"] == "GatherColumns"
        if case.startswith("moe"):
            assert got["kinds"]["model.layers.0.mlp.experts"] == "QuantExperts"
        err = float((got["logits"] - want).norm() / want.norm())
        assert err <= TOLERANCE[case], (case, r, err)
