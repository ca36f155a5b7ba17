"""A GGUF file's model config and tensor names, held to transformers' own GGUF loader.

For each architecture quantrt runs, a small GGUF is written with gguf's writer (the metadata keys
llama.cpp's converter writes, and the tensors of a two-layer model of that architecture); the
config quantrt rebuilds must equal ``load_gguf_checkpoint(...)["config"]``, and the name of every
tensor (linears through quantrt's reader, the rest through the loader's map) must equal what
``get_gguf_hf_weights_map`` gives on the same model. Bad metadata is refused by name.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import quantrt

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")
from transformers.modeling_gguf_pytorch_utils import (  # noqa: E402
    TENSOR_PROCESSORS,
    TensorProcessor,
    get_gguf_hf_weights_map,
    load_gguf_checkpoint,
)

from quantrt.formats.gguf import open_gguf  # noqa: E402
from quantrt.formats.gguf_arch import hf_config_dict, hf_tensor_names  # noqa: E402
from quantrt.models.config import model_config  # noqa: E402
from quantrt.models.loader import build_empty  # noqa: E402

H, F, NH, NKV, HD, V, L = 64, 96, 4, 2, 16, 128, 2
ARCHS = ["llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3"]


def head_dim(arch: str) -> int:
    """transformers reads no head size for qwen3 (its config's default, 128, stands)."""
    return 128 if arch == "qwen3" else HD


def vocab(arch: str) -> int:
    """Phi3Config's pad_token_id (32000) must be a row of the embedding."""
    return 32064 if arch == "phi3" else V


def tensors(arch: str) -> dict[str, tuple[int, ...]]:
    """name -> numpy shape of a two-layer model's tensors as llama.cpp names them."""
    HD, V = head_dim(arch), vocab(arch)
    q, kv = NH * HD, NKV * HD
    out: dict[str, tuple[int, ...]] = {"token_embd.weight": (V, H), "output_norm.weight": (H,)}
    if arch not in ("gemma2", "gemma3"):
        out["output.weight"] = (V, H)
    for i in range(L):
        b = f"blk.{i}."
        out[b + "attn_norm.weight"] = (H,)
        if arch == "phi3":
            out[b + "attn_qkv.weight"] = (q + 2 * kv, H)
            out[b + "ffn_up.weight"] = (2 * F, H)
        else:
            out[b + "attn_q.weight"] = (q, H)
            out[b + "attn_k.weight"] = (kv, H)
            out[b + "attn_v.weight"] = (kv, H)
            out[b + "ffn_gate.weight"] = (F, H)
            out[b + "ffn_up.weight"] = (F, H)
        out[b + "attn_output.weight"] = (H, q)
        out[b + "ffn_down.weight"] = (H, F)
        out[b + "ffn_norm.weight"] = (H,)
        if arch == "qwen2":
            for n, rows in (("attn_q", q), ("attn_k", kv), ("attn_v", kv)):
                out[b + f"{n}.bias"] = (rows,)
        if arch in ("qwen3", "gemma3"):
            out[b + "attn_q_norm.weight"] = (HD,)
            out[b + "attn_k_norm.weight"] = (HD,)
        if arch in ("gemma2", "gemma3"):
            out[b + "post_attention_norm.weight"] = (H,)
            out[b + "post_ffw_norm.weight"] = (H,)
    return out


def write(path: Path, arch: str) -> Path:
    file_arch = "llama" if arch == "mistral" else arch
    w = gguf.GGUFWriter(str(path), file_arch)
    w.add_name("mistral" if arch == "mistral" else "tiny")
    w.add_block_count(L)
    w.add_context_length(256)
    w.add_embedding_length(H)
    w.add_feed_forward_length(F)
    w.add_head_count(NH)
    w.add_head_count_kv(NKV)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_key_length(head_dim(arch))
    w.add_value_length(head_dim(arch))
    w.add_rope_dimension_count(head_dim(arch))
    w.add_vocab_size(vocab(arch))
    if arch in ("gemma2", "gemma3"):
        w.add_sliding_window(32)
    rng = np.random.default_rng(0)
    for n, shape in tensors(arch).items():
        w.add_tensor(n, (rng.standard_normal(shape) * 0.1).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(params=ARCHS)
def arch_file(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Path]:
    return request.param, write(tmp_path / f"{request.param}.gguf", request.param)


def test_config_equals_transformers(arch_file: tuple[str, Path]) -> None:
    _, path = arch_file
    index, _ = open_gguf(path)
    got = hf_config_dict(index.file.metadata, list(index.file.tensors), path)
    want = load_gguf_checkpoint(str(path), return_tensors=False)["config"]
    assert got == want


def test_names_equal_transformers(arch_file: tuple[str, Path]) -> None:
    arch, path = arch_file
    ckpt = quantrt.open_checkpoint(path)
    model = build_empty(model_config(ckpt), torch.float32)
    file_arch = "llama" if arch == "mistral" else arch
    processor = TENSOR_PROCESSORS.get(file_arch, TensorProcessor)(config=model.config)
    # gguf-py has no "mistral" table: transformers' own map needs the file's architecture named
    want = get_gguf_hf_weights_map(model, processor, model_type="llama" if arch == "mistral" else None)
    got = hf_tensor_names(model, file_arch)
    stored = set(tensors(arch))
    assert {n: got.get(n) for n in stored} == {n: want.get(n) for n in stored}
    assert all(want.get(n) is not None for n in stored), sorted(n for n in stored if n not in want)
    for prefix, entry in ckpt.layers.items():
        (stored_name,) = [t for role, t in entry.tensors.items() if role in ("weight", "qweight")]
        assert want[stored_name] == f"{prefix}.weight", (stored_name, prefix)


def test_model_loads_and_matches_transformers(arch_file: tuple[str, Path]) -> None:
    """The F32 file through quantrt and through transformers' GGUF loader: the same logits."""
    arch, path = arch_file
    if arch == "mistral":
        pytest.skip("transformers' GGUF loader fails on a Mistral file: gguf-py has no 'mistral' name table")
    got_model = quantrt.from_pretrained(path, device="cpu", dtype=torch.float32, progress=False)
    want_model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
    ids = torch.randint(0, vocab(arch), (2, 9))
    with torch.no_grad():
        got, want = got_model(ids).logits, want_model(ids).logits
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-4), float((got - want).abs().max())


def test_unsupported_architecture_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "falcon")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.ones((8, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(quantrt.CheckpointError, match=r"architecture 'falcon' is not supported.*llama"):
        quantrt.from_pretrained(path, device="cpu", progress=False)


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("llama.block_count", 0, "num_hidden_layers"),
        ("llama.embedding_length", 1 << 30, "hidden_size"),
        ("llama.attention.head_count_kv", 3, "not a multiple of 3"),
    ],
)
def test_bad_sizes_are_refused(tmp_path: Path, key: str, value: int, match: str) -> None:
    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32(key, value)
    for k, v in (
        ("llama.block_count", L),
        ("llama.embedding_length", H),
        ("llama.feed_forward_length", F),
        ("llama.attention.head_count", NH),
        ("llama.vocab_size", V),
        ("llama.attention.head_count_kv", NKV),
    ):
        if k != key:
            w.add_uint32(k, v)
    w.add_tensor("token_embd.weight", np.ones((8, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    index, _ = open_gguf(path)
    with pytest.raises(quantrt.CheckpointError, match=match):
        hf_config_dict(index.file.metadata, list(index.file.tensors), path)
