"""Tensor parallelism for real: two processes (torch.distributed, gloo, CPU) each load their half of
a checkpoint (column-parallel q/k/v/gate/up, row-parallel o/down with quantrt's all-reduce, the
output projection gathered; an MoE model's experts cut the same way inside QuantExperts) and their
logits must equal the single-process model's, their greedy tokens be its tokens: int4 (GPTQ, GGUF,
an MoE), GGUF q8_0, NVFP4 weight-only and W4A4, and block fp8.

The GGUF file's layers run on ``cpu.native_gguf``, which quantizes activations per 32-wide block:
a row-parallel rank's half of K starts on a block boundary, so each rank quantizes the same blocks
the whole layer would, and the two sides differ only by the order of the final sum. The
safetensors fixture has one key/value head for two ranks, so each rank holds a replica of it.
"""

from __future__ import annotations

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
    # NVFP4: 16-input groups along K and one global scale per tensor, which each rank keeps whole
    "nvfp4-w4a16": FIXTURES / "interop" / "ct-nvfp4-w4a16",
    "nvfp4-w4a4": FIXTURES / "interop" / "modelopt-nvfp4-kvfp8",
    # block fp8 (128 x 128 weight blocks, 1 x 128 activation groups): written by `quantrt quantize`
    # from a model wide enough that every cut falls on a block boundary (built by the test)
    "fp8-block128": None,
}
#: the block-fp8 model: every colwise part (N / 2) and rowwise part (K / 2) a multiple of 128
BLOCK_MODEL = dict(
    hidden_size=512, intermediate_size=1024, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
    head_dim=128, vocab_size=128, tie_word_embeddings=False,
)  # fmt: skip
WORLD = 2
#: the GGUF kernels quantize each layer's input to 8-bit blocks: a row-parallel layer's sum, added
#: up in another order across ranks, can differ in its last bit and move one code of the next
#: layer's input by a step; weight-only kernels (gptq) see only the summation order
TOLERANCE = {
    "gguf-q8_0": 2e-3,
    "gguf-q4_0": 2e-3,
    "gptq-kv-replicated": 1e-5,
    "moe-int4": 1e-5,
    "nvfp4-w4a16": 1e-5,
    "nvfp4-w4a4": 1e-5,
    "fp8-block128": 1e-5,
}


def _store(tmp_path: Path) -> str:
    """A rendezvous file of this test's own: a TCP port probed free can be taken by a test running
    beside it (pytest-xdist) before rank 0 binds it, and a rank that then meets the other test's
    store aborts (seen in CI: SIGABRT, "terminate called without an active exception")."""
    return f"file://{tmp_path / 'rendezvous'}"


def _rank(rank: int, store: str, path: str, ids: torch.Tensor, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=store, rank=rank, world_size=WORLD)
    try:
        model = quantrt.from_pretrained(path, device="cpu", dtype=torch.float32, tp=WORLD, progress=False)
        kinds = {n: type(m).__name__ for n, m in model.named_modules()}
        with torch.no_grad():
            logits = model(ids).logits
            tokens = model.generate(ids[:1], max_new_tokens=8, do_sample=False)
        torch.save(
            {"logits": logits, "tokens": tokens, "kinds": kinds, "config": model.config.to_dict()},
            f"{out}.{rank}",
        )
    finally:
        dist.destroy_process_group()


def _block_fp8_model(tmp_path: Path) -> Path:
    """A random Llama written dense, then as block fp8 by `quantrt quantize` (compressed-tensors)."""
    import transformers

    from quantrt.cli import main as cli

    torch.manual_seed(3)
    cfg = transformers.AutoConfig.for_model("llama", **BLOCK_MODEL)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.05)
    model.save_pretrained(tmp_path / "dense")
    dst = tmp_path / "fp8-block128"
    argv = ["quantize", str(tmp_path / "dense"), str(dst), "--scheme", "w8a8-fp8-block128", "--quiet"]
    assert cli(argv) == 0
    return dst


@pytest.mark.parametrize("case", sorted(CASES))
def test_two_ranks_equal_one(case: str, tmp_path: Path) -> None:
    path = CASES[case] or _block_fp8_model(tmp_path)
    if not path.exists():
        pytest.skip(f"fixture {path} is missing")
    torch.set_num_threads(1)
    single = quantrt.from_pretrained(path, device="cpu", dtype=torch.float32, progress=False)
    ids = torch.randint(0, single.config.vocab_size, (2, 11))
    with torch.no_grad():
        want = single(ids).logits
        want_tokens = single.generate(ids[:1], max_new_tokens=8, do_sample=False)
    out = str(tmp_path / "rank")
    mp.start_processes(
        _rank, args=(_store(tmp_path), str(path), ids, out), nprocs=WORLD, start_method="spawn"
    )
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
        assert torch.equal(got["tokens"], want_tokens), (case, r)  # greedy decoding, as tp=1 decodes


def _rank_refusal(rank: int, store: str, path: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=store, rank=rank, world_size=WORLD)
    try:
        quantrt.from_pretrained(path, device="cpu", dtype=torch.float32, tp=WORLD, progress=False)
        message = ""
    except quantrt.QuantrtError as e:
        message = f"{type(e).__name__}: {e}"
    finally:
        dist.destroy_process_group()
    Path(f"{out}.{rank}").write_text(message)


def test_a_cut_through_a_weight_block_is_refused(tmp_path: Path) -> None:
    """128 x 128 fp8 blocks under a 2-way cut of 128 outputs (half a block per rank): one clear
    error naming the tensor on every rank, not a silently wrong model."""
    path = FIXTURES / "interop" / "ct-fp8-w-block128-a-dyngroup128"
    out = str(tmp_path / "rank")
    mp.start_processes(
        _rank_refusal, args=(_store(tmp_path), str(path), out), nprocs=WORLD, start_method="spawn"
    )
    for r in range(WORLD):
        message = Path(f"{out}.{r}").read_text()
        assert "ShardError" in message and "would split a group/block" in message, message
