"""GGUF checkpoints: quantrt's own container parser and format reader, on files llama.cpp wrote.

The fixtures (tests/fixtures/gguf, see its README and make.py) were quantized by llama.cpp's own
``llama_model_quantize`` through llama-cpp-python 0.3.36 from a float32 GGUF that gguf-py's
GGUFWriter wrote; small extra files here are written by gguf-py 0.19's GGUFWriter, and broken
ones by editing bytes of a fixture copy or by packing GGUF bytes with ``struct``. The oracles
are gguf-py's ``GGUFReader`` (container) and ``gguf.quants.dequantize`` (llama.cpp's reference
dequantizers), with the q/k row un-permutation computed here from transformers' formula.

Row order of the fixtures: make.py wrote its generated q/k weights as they came (it never ran
llama.cpp's converter permutation), and llama.cpp's quantizer keeps row order. A GGUF reader
must still read them as llama.cpp-permuted rows, so the Hugging Face q_proj of these files is
``reverse_permute(stored rows)``, not make.py's source matrix (checked below).
"""

from __future__ import annotations

import functools
import importlib.util
import struct
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as GT
from gguf.quants import dequantize as gguf_dequantize

from quantrt import reference
from quantrt.checkpoint.checkpoint import Checkpoint, open_checkpoint
from quantrt.checkpoint.gguf_file import GGUFFile
from quantrt.errors import CheckpointError, ShardError
from quantrt.formats.base import TensorIndex
from quantrt.formats.gguf import GGUFReader, open_gguf

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gguf"
FILES = sorted(p.name for p in FIXTURES.glob("*.gguf"))
N_HEAD, N_HEAD_KV = 8, 4  # make.py's NH, NKV

# GGUF stem -> Hugging Face prefix, written out independently of quantrt.formats.gguf
HF_NAMES = {
    "token_embd": "model.embed_tokens",
    "output": "lm_head",
    "blk.0.attn_q": "model.layers.0.self_attn.q_proj",
    "blk.0.attn_k": "model.layers.0.self_attn.k_proj",
    "blk.0.attn_v": "model.layers.0.self_attn.v_proj",
    "blk.0.attn_output": "model.layers.0.self_attn.o_proj",
    "blk.0.ffn_gate": "model.layers.0.mlp.gate_proj",
    "blk.0.ffn_up": "model.layers.0.mlp.up_proj",
    "blk.0.ffn_down": "model.layers.0.mlp.down_proj",
}
BLOCK_ELEMS = {"Q4_0": 32, "Q8_0": 32, "Q2_K": 256, "Q3_K": 256, "Q4_K": 256, "Q5_K": 256, "Q6_K": 256}


def reverse_permute(w: np.ndarray, n_head: int, num_kv_heads: int | None = None) -> np.ndarray:
    """transformers' LlamaTensorProcessor._reverse_permute_weights (modeling_gguf_pytorch_utils)."""
    if num_kv_heads is not None and n_head != num_kv_heads:
        n_head = num_kv_heads
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def hf_order(stem: str, w: np.ndarray) -> np.ndarray:
    if stem.endswith("attn_q"):
        return reverse_permute(w, N_HEAD, N_HEAD)
    if stem.endswith("attn_k"):
        return reverse_permute(w, N_HEAD, N_HEAD_KV)
    return w


def open_gguf_checkpoint(path: Path) -> Checkpoint:
    """``open_checkpoint(path)`` once it reads .gguf; until that is wired, the same Checkpoint
    built from quantrt.formats.gguf.open_gguf (its GGUFIndex and GGUFReader)."""
    try:
        return open_checkpoint(path)
    except CheckpointError as e:
        if "GGUF files arrive with" not in str(e):
            raise
    index, reader = open_gguf(path)
    ck = Checkpoint.__new__(Checkpoint)
    ck.path, ck.directory, ck.config = path, path.parent, None
    ck.index, ck.reader = index, reader
    ck.qconfig, ck.qconfig_source = reader.qconfig, reader.source
    ck._layers = None
    return ck


@functools.cache
def gguf_py(name: str) -> gguf.GGUFReader:
    return gguf.GGUFReader(FIXTURES / name)


@functools.cache
def checkpoint(name: str) -> Checkpoint:
    return open_gguf_checkpoint(FIXTURES / name)


def expected_weight(file: str, name: str) -> np.ndarray:
    """gguf-py's dequantization of a fixture tensor, [N, K], rows in Hugging Face order."""
    (t,) = [t for t in gguf_py(file).tensors if t.name == name]
    K = int(t.shape[0])
    w = gguf_dequantize(t.data, t.tensor_type).reshape(-1, K)
    return hf_order(name[: -len(".weight")], w)


def assert_bits_equal(mine: torch.Tensor, expected: np.ndarray, what: str) -> None:
    exp = torch.from_numpy(np.ascontiguousarray(expected, dtype=np.float32)).reshape(mine.shape)
    assert mine.dtype == torch.float32, what
    same = mine.view(torch.int32) == exp.view(torch.int32)
    assert bool(same.all()), f"{what}: {int((~same).sum())} fp32 bit patterns differ"


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref.double()).norm() / ref.double().norm())


# -- the container ---------------------------------------------------------------------------------


@pytest.mark.parametrize("file", FILES)
def test_container_matches_gguf_py(file: str) -> None:
    mine, theirs = GGUFFile(FIXTURES / file), gguf_py(file)
    assert mine.version == 3 and mine.alignment == 32
    assert set(mine.tensors) == {t.name for t in theirs.tensors}
    for t in theirs.tensors:
        info = mine.tensors[t.name]
        dims = tuple(int(d) for d in t.shape)
        assert mine.dims[t.name] == dims
        assert mine.ggml_types[t.name] == info.dtype_name == t.tensor_type.name
        assert mine.data_start + info.start == t.data_offset
        if t.tensor_type == GT.F32:
            assert info.dtype == torch.float32 and info.shape == dims[::-1]
        else:
            B = BLOCK_ELEMS[t.tensor_type.name]
            T = gguf.GGML_QUANT_SIZES[t.tensor_type][1]
            assert info.dtype == torch.uint8
            assert info.shape == (int(np.prod(dims[1:])), dims[0] // B * T)
        got = mine.get(t.name)
        assert tuple(got.shape) == info.shape
        assert got.contiguous().view(torch.uint8).numpy().tobytes() == np.asarray(t.data).tobytes()
    fields = {k: f.contents() for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
    assert mine.metadata == fields
    assert mine.metadata["general.file_type"] in (2, 7, 10, 12, 15, 17, 18)


def test_get_rows_reads_only_those_rows() -> None:
    f = GGUFFile(FIXTURES / "tiny-llama-Q4_K_M.gguf")
    for name in ("blk.0.ffn_up.weight", "output_norm.weight"):
        whole = f.get(name)
        assert torch.equal(f.get_rows(name, 3, 17), whole[3:17])
    with pytest.raises(CheckpointError, match=r"rows \[5, 900\) of 'blk.0.ffn_up.weight' \[768, 288\]"):
        f.get_rows("blk.0.ffn_up.weight", 5, 900)
    with pytest.raises(CheckpointError, match="no tensor 'nope'"):
        f.get("nope")


def write_small_llama(path: Path) -> dict[str, torch.Tensor]:
    """A llama GGUF with F16/BF16/F32 weights, a q bias, a Q8_0 tensor and every value type,
    written by gguf-py's GGUFWriter. Returns the tensors as written."""
    g = torch.Generator().manual_seed(0)
    t = {
        "token_embd.weight": torch.randn(10, 32, generator=g).half(),
        "blk.0.attn_q.weight": torch.randn(8, 32, generator=g).half(),
        "blk.0.attn_q.bias": torch.randn(8, generator=g),
        "blk.0.attn_k.weight": torch.randn(4, 32, generator=g).bfloat16(),
        "blk.0.attn_v.weight": torch.randn(4, 32, generator=g),
        "blk.0.attn_norm.weight": torch.ones(32),
        "blk.0.ffn_up.weight": torch.randn(6, 64, generator=g),
    }
    w = gguf.GGUFWriter(path, "llama")
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -5)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_int32("test.i32", -(2**31))
    w.add_uint64("test.u64", 2**63)
    w.add_int64("test.i64", -(2**62))
    w.add_float64("test.f64", 0.1)
    w.add_bool("test.bool", True)
    w.add_array("test.strings", ["a", "bé", ""])
    w.add_array("test.floats", [0.5, -1.25])
    w.add_array("test.nested", [[1, 2], [3]])
    for name, x in t.items():
        if x.dtype == torch.bfloat16:
            w.add_tensor(name, x.view(torch.uint16).numpy(), raw_dtype=GT.BF16)
        elif name == "blk.0.ffn_up.weight":
            w.add_tensor(name, gguf.quants.quantize(x.numpy(), GT.Q8_0), raw_dtype=GT.Q8_0)
        else:
            w.add_tensor(name, x.numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return t


def test_plain_dtypes_and_every_value_type(tmp_path: Path) -> None:
    path = tmp_path / "small.gguf"
    written = write_small_llama(path)
    f = GGUFFile(path)
    m = f.metadata
    assert (m["test.u8"], m["test.i8"], m["test.u16"], m["test.i16"]) == (200, -5, 60000, -30000)
    assert (m["test.i32"], m["test.u64"], m["test.i64"]) == (-(2**31), 2**63, -(2**62))
    assert m["test.f64"] == 0.1 and m["test.bool"] is True
    assert m["test.strings"] == ["a", "bé", ""] and m["test.floats"] == [0.5, -1.25]
    assert m["test.nested"] == [[1, 2], [3]]
    assert f.metadata_types["test.nested"] == "array" and f.metadata_types["test.u8"] == "u8"
    for name, x in written.items():
        if name == "blk.0.ffn_up.weight":
            assert f.tensors[name].shape == (6, 2 * 34) and f.ggml_types[name] == "Q8_0"
            continue
        got = f.get(name)
        assert got.dtype == x.dtype and tuple(got.shape) == tuple(x.shape), name
        assert torch.equal(got, x), name
    assert f.ggml_types["blk.0.attn_k.weight"] == "BF16" and f.ggml_types["blk.0.attn_q.weight"] == "F16"


# -- the format reader: names, schemes, shapes --------------------------------------------------


@pytest.mark.parametrize("file", FILES)
def test_every_tensor_is_listed_with_its_own_scheme(file: str) -> None:
    ck = checkpoint(file)
    assert ck.format == "gguf"
    layers = ck.layers
    seen = set()
    for t in gguf_py(file).tensors:
        dims = [int(d) for d in t.shape]
        stem = t.name[: -len(".weight")]
        if len(dims) == 1:
            assert stem not in HF_NAMES and not any(
                e.tensors.get("weight") == t.name for e in layers.values()
            )
            continue
        prefix = HF_NAMES[stem]
        e = layers[prefix]
        assert e.tensors == {"qweight": t.name}
        assert str(e.scheme) == f"gguf-{t.tensor_type.name.lower()}", prefix
        assert (e.N, e.K) == (dims[1], dims[0]), prefix
        assert e.kind == ("embedding" if stem == "token_embd" else "linear")
        assert any("un-permuted" in n for n in e.notes) == stem.endswith(("attn_q", "attn_k"))
        seen.add(prefix)
    assert seen == set(layers) == set(HF_NAMES.values())
    assert [p for p, _ in ck.weights()] == list(layers)
    summary = ck.summary()
    assert summary["format"] == "gguf" and summary["quantized_layers"] == len(HF_NAMES)


def test_q4_k_m_mixes_types_per_tensor() -> None:
    schemes = {p: str(e.scheme) for p, e in checkpoint("tiny-llama-Q4_K_M.gguf").layers.items()}
    assert schemes["model.layers.0.self_attn.v_proj"] == "gguf-q6_k"
    assert schemes["model.layers.0.mlp.down_proj"] == "gguf-q6_k"
    assert schemes["model.layers.0.self_attn.q_proj"] == "gguf-q4_k"
    assert schemes["model.layers.0.mlp.up_proj"] == "gguf-q4_k"
    assert schemes["model.embed_tokens"] == "gguf-q4_k" and schemes["lm_head"] == "gguf-q6_k"


# -- dequantization ---------------------------------------------------------------------------------


@pytest.mark.parametrize("file", FILES)
def test_dequantize_equals_llama_cpp_bit_for_bit(file: str) -> None:
    ck = checkpoint(file)
    kinds = set()
    for prefix, qw in ck.weights():
        name = qw.entry.tensors["qweight"]
        assert_bits_equal(qw.dequantize(), expected_weight(file, name), f"{file}:{prefix}")
        kinds.add(qw.entry.kind)
    assert kinds == {"embedding", "linear"}
    assert "lm_head" in dict(ck.weights())


def _load_make() -> object:
    spec = importlib.util.spec_from_file_location("gguf_fixture_make", FIXTURES / "make.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_fixture_rows_are_stored_as_generated_and_read_unpermuted() -> None:
    """make.py's fixed-seed source weights match the Q8_0 file in stored row order; quantrt's
    q_proj/k_proj are those rows un-permuted (and so far from the source matrix)."""
    mk: object = _load_make()
    rng = np.random.default_rng(7)
    source = {n: mk.weight(rng, mk.V, mk.H) for n in ("token_embd", "output")}  # type: ignore[attr-defined]
    for n, (o, i) in mk.LINEARS.items():  # type: ignore[attr-defined]
        source[n] = mk.weight(rng, o, i)  # type: ignore[attr-defined]
    ck = checkpoint("tiny-llama-Q8_0.gguf")
    f = GGUFFile(FIXTURES / "tiny-llama-Q8_0.gguf")
    for n, heads in (("attn_q", N_HEAD), ("attn_k", N_HEAD_KV)):
        src = torch.from_numpy(source[n])
        stored = reference.gguf.dequantize_blocks(f.get(f"blk.0.{n}.weight"), "q8_0")
        assert rel(stored, src) < 0.01, n
        hf = ck.layers[HF_NAMES[f"blk.0.{n}"]]
        w = dict(ck.weights())[hf.prefix].dequantize()
        assert rel(w, torch.from_numpy(reverse_permute(source[n], heads))) < 0.01, n
        assert rel(w, src) > 1.0, n


# -- QuantLinear: one rank, two ranks, fused ---------------------------------------------------------


@pytest.mark.parametrize("file", FILES)
def test_every_layer_runs_through_quantlinear(file: str) -> None:
    ck = checkpoint(file)
    g = torch.Generator().manual_seed(len(file))
    for prefix, qw in ck.weights():
        x = torch.randn(5, qw.shape[1], generator=g)
        ref = reference.linear(x, qw.canonical())
        lin = ck.linear(prefix, act_dtype=torch.float32)
        y = lin(x)
        # a kernel that quantizes activations to 8-bit blocks (llama.cpp's way) says so
        tol = 1e-2 if lin._kernel.quantizes_activations else 1e-5
        assert rel(y, ref) < tol, (prefix, rel(y, ref))


@pytest.mark.parametrize("file", FILES)
def test_two_tensor_parallel_ranks_equal_one(file: str) -> None:
    ck = checkpoint(file)
    g = torch.Generator().manual_seed(5)
    rows_checked = 0
    for prefix, qw in ck.weights():
        K = qw.shape[1]
        x = torch.randn(3, K, generator=g)
        y1 = ck.linear(prefix, act_dtype=torch.float32)(x)
        cols = [
            ck.linear(prefix, act_dtype=torch.float32, parallel="column", tp_rank=r, tp_size=2)
            for r in (0, 1)
        ]
        assert rel(torch.cat([c(x) for c in cols], -1), y1) < 1e-5, prefix
        B = qw.scheme.group_size
        if (K // 2) % B:
            with pytest.raises(
                ShardError,
                match=rf"qweight: a cut at K \(input\) element {K // 2} is not a multiple of {B}: "
                "it would split a group/block",
            ):
                ck.linear(prefix, act_dtype=torch.float32, parallel="row", tp_rank=0, tp_size=2)
            continue
        rows = [
            ck.linear(prefix, act_dtype=torch.float32, parallel="row", tp_rank=r, tp_size=2) for r in (0, 1)
        ]
        y = rows[0](x[:, : K // 2]) + rows[1](x[:, K // 2 :])
        assert rel(y, y1) < 1e-5, prefix
        rows_checked += 1
    assert rows_checked > 0


@pytest.mark.parametrize("tp", [2, 16])
def test_column_ranks_hold_slices_of_the_unpermuted_rows(tp: int) -> None:
    """Un-permuting happens on the full tensor, so any column cut, even one inside a head (tp=16:
    32 of a head's 64 rows), gives each rank the Hugging Face rows of its range."""
    file = "tiny-llama-Q4_0.gguf"
    ck = checkpoint(file)
    w = torch.from_numpy(expected_weight(file, "blk.0.attn_q.weight"))
    x = torch.randn(4, w.shape[1], generator=torch.Generator().manual_seed(1))
    part = w.shape[0] // tp
    for r in range(tp):
        lin = ck.linear(
            "model.layers.0.self_attn.q_proj",
            act_dtype=torch.float32,
            parallel="column",
            tp_rank=r,
            tp_size=tp,
        )
        tol = 1e-2 if lin._kernel.quantizes_activations else 1e-5
        assert rel(lin(x), x @ w[r * part : (r + 1) * part].T) < tol, r


def test_fused_layers_equal_their_shards() -> None:
    groups = [
        [f"model.layers.0.self_attn.{n}_proj" for n in "qkv"],
        [f"model.layers.0.mlp.{n}_proj" for n in ("gate", "up")],
    ]
    fused = 0
    g = torch.Generator().manual_seed(3)
    for file in FILES:
        ck = checkpoint(file)
        for names in groups:
            x = torch.randn(4, ck.layers[names[0]].K, generator=g)
            separate = torch.cat([ck.linear(n, act_dtype=torch.float32)(x) for n in names], dim=-1)
            if len({str(ck.layers[n].scheme) for n in names}) != 1:
                try:  # slices of different types: refused, or one kernel per run of equal types
                    mixed = ck.linear(names, act_dtype=torch.float32)
                except CheckpointError as err:
                    assert "must share scheme and K" in str(err)
                    continue
                assert rel(mixed(x), separate) < 1e-5, (file, names)
                continue
            assert rel(ck.linear(names, act_dtype=torch.float32)(x), separate) < 1e-5, (file, names)
            ranks = [
                ck.linear(names, act_dtype=torch.float32, parallel="column", tp_rank=r, tp_size=2)
                for r in (0, 1)
            ]
            sizes = [ck.layers[n].N // 2 for n in names]
            per_rank = [y.split(sizes, -1) for y in (ranks[0](x), ranks[1](x))]
            joined = torch.cat(
                [torch.cat([per_rank[0][i], per_rank[1][i]], -1) for i in range(len(names))], -1
            )
            assert rel(joined, separate) < 1e-5, (file, names)
            fused += 1
    assert fused >= 4


# -- other architectures and dense layers ---------------------------------------------------------


def test_unknown_architecture_keeps_gguf_names_and_row_order(tmp_path: Path) -> None:
    data = bytearray((FIXTURES / "tiny-llama-Q8_0.gguf").read_bytes())
    key = b"general.architecture"
    at = data.index(key) + len(key) + 4 + 8
    assert data[at : at + 5] == b"llama"
    data[at : at + 5] = b"llamb"
    path = tmp_path / "llamb.gguf"
    path.write_bytes(data)
    ck = open_gguf_checkpoint(path)
    assert set(ck.layers) == set(HF_NAMES)
    qw = dict(ck.weights())["blk.0.attn_q"]
    (t,) = [t for t in gguf_py("tiny-llama-Q8_0.gguf").tensors if t.name == "blk.0.attn_q.weight"]
    assert_bits_equal(qw.dequantize(), gguf_dequantize(t.data, t.tensor_type), "unknown arch q: stored order")
    assert ck.layers["token_embd"].kind == "embedding"


def test_dense_layers_keep_their_dtype_and_are_unpermuted(tmp_path: Path) -> None:
    path = tmp_path / "small.gguf"
    written = write_small_llama(path)
    ck = open_gguf_checkpoint(path)
    layers = ck.layers
    assert set(layers) == {
        "model.embed_tokens",
        "model.layers.0.self_attn.q_proj",
        "model.layers.0.self_attn.k_proj",
        "model.layers.0.self_attn.v_proj",
        "model.layers.0.mlp.up_proj",
    }
    dtypes = {p: e.dtype for p, e in layers.items() if not e.quantized}
    assert dtypes == {
        "model.embed_tokens": torch.float16,
        "model.layers.0.self_attn.q_proj": torch.float16,
        "model.layers.0.self_attn.k_proj": torch.bfloat16,
        "model.layers.0.self_attn.v_proj": torch.float32,
    }
    assert layers["model.embed_tokens"].kind == "embedding"
    assert str(layers["model.layers.0.mlp.up_proj"].scheme) == "gguf-q8_0"
    q = layers["model.layers.0.self_attn.q_proj"]
    assert q.bias == "blk.0.attn_q.bias" and (q.N, q.K) == (8, 32)

    def hf(name: str, heads: int) -> torch.Tensor:
        return torch.from_numpy(reverse_permute(written[name].float().numpy(), heads)).to(written[name].dtype)

    lin = ck.linear("model.layers.0.self_attn.q_proj", act_dtype=torch.float32)
    assert torch.equal(lin.weight, hf("blk.0.attn_q.weight", 2).float())
    assert torch.equal(lin.bias, hf("blk.0.attn_q.bias", 2))
    k = ck.linear("model.layers.0.self_attn.k_proj", act_dtype=torch.float32)
    assert torch.equal(k.weight, hf("blk.0.attn_k.weight", 1).float())
    v = ck.linear("model.layers.0.self_attn.v_proj", act_dtype=torch.float32)
    assert torch.equal(v.weight, written["blk.0.attn_v.weight"])
    assert not torch.equal(hf("blk.0.attn_q.weight", 2), written["blk.0.attn_q.weight"])


def test_stacked_experts_are_listed_one_by_one(tmp_path: Path) -> None:
    path = tmp_path / "moe.gguf"
    g = torch.Generator().manual_seed(2)
    w, b = torch.randn(3, 4, 64, generator=g), torch.randn(3, 4, generator=g)
    q = gguf.quants.quantize(w.numpy(), GT.Q8_0)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_head_count(2)
    writer.add_tensor("blk.0.ffn_up_exps.weight", q, raw_dtype=GT.Q8_0)
    writer.add_tensor("blk.0.ffn_up_exps.bias", b.numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    ck = open_gguf_checkpoint(path)
    assert list(ck.layers) == [f"blk.0.ffn_up_exps.{e}" for e in range(3)]
    expected = gguf_dequantize(q, GT.Q8_0).reshape(3, 4, 64)
    for e in range(3):
        entry = ck.layers[f"blk.0.ffn_up_exps.{e}"]
        assert (entry.kind, entry.N, entry.K, str(entry.scheme)) == ("expert", 4, 64, "gguf-q8_0")
        assert entry.select == {"qweight": e, "bias": e} and entry.bias == "blk.0.ffn_up_exps.bias"
        qw = dict(ck.weights())[entry.prefix]
        assert_bits_equal(qw.dequantize(), expected[e], f"expert {e}")
        # running an expert waits for MoE support: linear() says so
        with pytest.raises(CheckpointError, match="is an MoE expert weight"):
            ck.linear(entry.prefix, act_dtype=torch.float32)
    with pytest.raises(
        CheckpointError, match=r"blk.0.ffn_up_exps.weight: expert index 3 is outside \[0, 3\)"
    ):
        ck.index.read_index("blk.0.ffn_up_exps.weight", 3)


# -- bad input: one clear error each, at once ---------------------------------------------------------


def u32(v: int) -> bytes:
    return struct.pack("<I", v)


def u64(v: int) -> bytes:
    return struct.pack("<Q", v)


def gstr(s: str) -> bytes:
    b = s.encode()
    return u64(len(b)) + b


def kv_u32(key: str, v: int) -> bytes:
    return gstr(key) + u32(4) + u32(v)


def kv_str(key: str, v: str) -> bytes:
    return gstr(key) + u32(8) + gstr(v)


def tensor_info(name: str, dims: tuple[int, ...], type_id: int, offset: int) -> bytes:
    return gstr(name) + u32(len(dims)) + b"".join(u64(d) for d in dims) + u32(type_id) + u64(offset)


def gguf_bytes(
    kvs: list[bytes],
    infos: list[bytes],
    data: bytes,
    *,
    version: int = 3,
    n_tensors: int | None = None,
    n_kv: int | None = None,
    align: int = 32,
) -> bytes:
    """A GGUF file from packed pieces; counts default to the pieces given."""
    head = b"GGUF" + u32(version) + u64(len(infos) if n_tensors is None else n_tensors)
    head += u64(len(kvs) if n_kv is None else n_kv) + b"".join(kvs) + b"".join(infos)
    return head + b"\0" * (-len(head) % align) + data


LLAMA = [kv_str("general.architecture", "llama"), kv_u32("llama.attention.head_count", 2)]
F32_8x32 = (32, 8)  # dims, fastest first


def f32_tensor(name: str = "blk.0.ffn_up.weight", dims: tuple[int, ...] = F32_8x32, offset: int = 0) -> bytes:
    return tensor_info(name, dims, 0, offset)


def expect_error(path: Path, pattern: str, opener: Callable[[Path], object] = GGUFFile) -> None:
    """The one error, naming the file, raised quickly and without allocating what the header claims."""
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(CheckpointError, match=pattern) as err:
            opener(path)
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert time.perf_counter() - t0 < 0.5
    assert peak < 2**20, peak
    assert str(path) in str(err.value)


def fixture_copy(
    tmp_path: Path, edit: Callable[[bytearray], None], name: str = "tiny-llama-Q4_K_M.gguf"
) -> Path:
    data = bytearray((FIXTURES / name).read_bytes())
    edit(data)
    path = tmp_path / f"broken-{name}"
    path.write_bytes(data)
    return path


def write(tmp_path: Path, data: bytes, name: str = "crafted.gguf") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_bad_magic_version_and_endianness(tmp_path: Path) -> None:
    def put(at: int, b: bytes) -> Callable[[bytearray], None]:
        return lambda d: d.__setitem__(slice(at, at + len(b)), b)

    expect_error(fixture_copy(tmp_path, put(0, b"GGML")), r"bad magic: expected b'GGUF', found b'GGML'")
    expect_error(
        fixture_copy(tmp_path, put(4, u32(1))), r"unsupported GGUF version 1: expected one of \[2, 3\]"
    )
    expect_error(fixture_copy(tmp_path, put(4, u32(7))), r"unsupported GGUF version 7")
    expect_error(
        fixture_copy(tmp_path, put(4, struct.pack(">I", 3))),
        r"a big-endian GGUF file \(version field reads 3 big-endian\); only little-endian GGUF is supported",
    )
    expect_error(write(tmp_path, b"GGUF" + u32(3) + u64(0)), r"metadata count: needs 8 bytes at offset 16")
    expect_error(write(tmp_path, b"GG"), r"magic: needs 4 bytes at offset 0 but the file has 2 left")


def test_counts_and_lengths_that_cannot_fit_fail_at_once(tmp_path: Path) -> None:
    huge = 2**60
    expect_error(
        fixture_copy(tmp_path, lambda d: d.__setitem__(slice(8, 16), u64(huge))),
        rf"the tensor count is {huge}, but {huge} x at least 32 bytes cannot fit",
    )
    expect_error(
        fixture_copy(tmp_path, lambda d: d.__setitem__(slice(16, 24), u64(huge))),
        rf"the metadata count is {huge}, but {huge} x at least 13 bytes cannot fit",
    )
    expect_error(
        fixture_copy(tmp_path, lambda d: d.__setitem__(slice(24, 32), u64(2**62))),
        rf"metadata key #0: string length {2**62} cannot fit in the \d+ bytes left at offset 32",
    )
    big_array = gstr("tokenizer.ggml.tokens") + u32(9) + u32(8) + u64(huge)
    expect_error(
        write(tmp_path, gguf_bytes([big_array], [], b"")),
        rf"metadata 'tokenizer.ggml.tokens': the array length \(string\) is {huge}, but",
    )
    u8_array = gstr("a") + u32(9) + u32(0) + u64(2**40)
    expect_error(
        write(tmp_path, gguf_bytes([u8_array], [], b"")), r"the array length \(u8\) is 1099511627776"
    )
    long_value = gstr("general.name") + u32(8) + u64(2**50)
    expect_error(
        write(tmp_path, gguf_bytes([long_value], [], b"")), r"metadata 'general.name': string length"
    )
    long_name = u64(2**33) + b"x"
    expect_error(
        write(tmp_path, gguf_bytes([], [long_name], b"")), r"tensor #0 name: string length 8589934592"
    )


def test_bad_metadata(tmp_path: Path) -> None:
    expect_error(
        write(tmp_path, gguf_bytes([gstr("k") + u32(13) + u32(0)], [], b"")),
        r"metadata 'k': unknown value type 13; known: 0-12",
    )
    expect_error(
        write(tmp_path, gguf_bytes([gstr("k") + u32(9) + u32(77) + u64(1)], [], b"")),
        r"metadata 'k': unknown array element type 77",
    )
    expect_error(
        write(tmp_path, gguf_bytes([kv_u32("k", 1), kv_u32("k", 2)], [], b"")),
        r"metadata key 'k' appears twice",
    )
    for bad in (0, 24):
        expect_error(
            write(tmp_path, gguf_bytes([kv_u32("general.alignment", bad)], [], b"")),
            rf"metadata 'general.alignment' must be a positive power of two, found {bad}",
        )
    two = gstr("t") + u32(9) + u32(8) + u64(2) + gstr("ok") + u64(2**40)
    expect_error(
        write(tmp_path, gguf_bytes([two], [], b"")),
        r"metadata 't'\[1\]: string length 1099511627776 cannot fit in the \d+ bytes left",
    )
    cut = gstr("t") + u32(9) + u32(8) + u64(2) + gstr("ok")
    header = b"GGUF" + u32(3) + u64(0) + u64(1)
    expect_error(
        write(tmp_path, header + cut + b"\0" * 7), r"metadata 't'\[1\] length: needs 8 bytes at offset 59"
    )
    bad_key = u64(2) + b"\xff\xfe" + u32(4) + u32(0)
    expect_error(write(tmp_path, gguf_bytes([bad_key], [], b"")), r"metadata key #0: not valid UTF-8")


def test_bad_tensor_infos(tmp_path: Path) -> None:
    data = bytes(8 * 32 * 4)
    expect_error(
        write(tmp_path, gguf_bytes(LLAMA, [tensor_info("w", (32, 8), 99, 0)], data)),
        r"tensor 'w': unknown ggml type id 99",
    )
    for type_id, name in ((17, "IQ2_XS"), (15, "Q8_K"), (34, "TQ1_0"), (9, "Q8_1")):
        expect_error(
            write(tmp_path, gguf_bytes(LLAMA, [tensor_info("w", (256, 8), type_id, 0)], data)),
            rf"tensor 'w': type {name} is not supported yet; supported: F32, F16, BF16",
        )
    expect_error(
        write(tmp_path, gguf_bytes(LLAMA, [f32_tensor("w"), f32_tensor("w", offset=1024)], data * 2)),
        r"tensor 'w' is listed twice",
    )
    expect_error(
        write(tmp_path, gguf_bytes(LLAMA, [tensor_info("w", (100, 8), 12, 0)], data)),
        r"tensor 'w': Q4_K row length ne0=100 is not a whole number of 256-element blocks",
    )
    expect_error(
        write(tmp_path, gguf_bytes(LLAMA, [tensor_info("w", (1,) * 5, 0, 0)], data)),
        r"tensor 'w': n_dims must be 1..4, found 5",
    )
    expect_error(
        write(tmp_path, gguf_bytes(LLAMA, [f32_tensor(offset=8)], data + bytes(32))),
        r"tensor 'blk.0.ffn_up.weight': offset 8 is not a multiple of general.alignment 32",
    )
    aligned64 = [*LLAMA, kv_u32("general.alignment", 64)]
    expect_error(
        write(tmp_path, gguf_bytes(aligned64, [f32_tensor(offset=32)], data + bytes(64), align=64)),
        r"offset 32 is not a multiple of general.alignment 64",
    )
    expect_error(
        write(tmp_path, gguf_bytes(LLAMA, [f32_tensor("a"), f32_tensor("b", offset=512)], data * 2)),
        r"tensors 'a' \[0, 1024\) and 'b' \[512, 1536\) overlap in the data section",
    )
    expect_error(
        write(tmp_path, gguf_bytes(LLAMA, [tensor_info("w", (2**40, 2**40), 0, 0)], data)),
        r"tensor 'w': dims \[1099511627776, 1099511627776\] overflow a 64-bit element count",
    )
    expect_error(
        write(tmp_path, gguf_bytes(LLAMA, [tensor_info("w", (2**20, 2**20), 0, 0)], data)),
        r"tensor 'w': F32 \[1048576, 1048576\] needs bytes \[0, 4398046511104\) of "
        r"the data section, but it holds only 1024 bytes",
    )


def test_truncated_fixture_names_the_tensor_past_the_end(tmp_path: Path) -> None:
    path = fixture_copy(tmp_path, lambda d: d.__delitem__(slice(len(d) - 100, len(d))))
    expect_error(
        path,
        r"tensor 'blk.0.ffn_up.weight': Q4_K \[512, 768\] needs bytes \[\d+, \d+\) of the data section, "
        r"but it holds only \d+ bytes \(truncated file\?\)",
    )
    cut = fixture_copy(tmp_path, lambda d: d.__delitem__(slice(200, len(d))))
    expect_error(cut, r"the tensor count is 12, but 12 x at least 32 bytes cannot fit in the 176 bytes left")
    cut = fixture_copy(tmp_path, lambda d: d.__delitem__(slice(1100, len(d))))
    expect_error(
        cut, r"tensor '[\w.]+' \w+: needs \d+ bytes at offset \d+ but the file has \d+ left \(truncated"
    )


def test_reader_level_errors(tmp_path: Path) -> None:
    q = tensor_info("blk.0.attn_q.weight", (32, 8), 0, 0)
    no_heads = write(tmp_path, gguf_bytes([kv_str("general.architecture", "llama")], [q], bytes(1024)))
    expect_error(
        no_heads,
        r"metadata 'llama.attention.head_count' is missing; it is needed to undo llama.cpp's rope "
        r"permutation of 'blk.0.attn_q.weight'",
        open_gguf,
    )
    three = [kv_str("general.architecture", "llama"), kv_u32("llama.attention.head_count", 3)]
    expect_error(
        write(tmp_path, gguf_bytes(three, [q], bytes(1024))),
        r"tensor 'blk.0.attn_q.weight' \[32, 8\]: expected a row count that is a multiple of 2 x 3 heads",
        open_gguf,
    )
    bias = tensor_info("blk.0.ffn_up.bias", (5,), 0, 1024)
    expect_error(
        write(tmp_path, gguf_bytes(LLAMA, [f32_tensor(), bias], bytes(1056))),
        r"tensor 'blk.0.ffn_up.bias': expected a float bias of shape \[8\], found F32 \[5\]",
        lambda p: open_gguf(p)[1].layers(),
    )
    index = TensorIndex([GGUFFile(FIXTURES / "tiny-llama-Q8_0.gguf")])
    with pytest.raises(CheckpointError, match=r"the gguf reader needs a GGUFIndex over one \.gguf file"):
        GGUFReader({}, index, "x.gguf")


def test_nan_scale_is_refused_where_the_layer_is_read(tmp_path: Path) -> None:
    f = GGUFFile(FIXTURES / "tiny-llama-Q4_K_M.gguf")
    info = f.tensors["blk.0.ffn_up.weight"]
    at = f.data_start + info.start + 5 * 288 + 144  # row 5, second Q4_K block: its f16 d
    path = fixture_copy(tmp_path, lambda d: d.__setitem__(slice(at, at + 2), b"\x00\x7e"))
    ck = open_gguf_checkpoint(path)
    pattern = (
        r"broken-tiny-llama-Q4_K_M.gguf: layer model.layers.0.mlp.up_proj: qweight: 1 q4_k block\(s\) "
        r"have a NaN or infinite f16 scale, first at row 5, block 1"
    )
    with pytest.raises(CheckpointError, match=pattern):
        dict(ck.weights())["model.layers.0.mlp.up_proj"].dequantize()
    with pytest.raises(CheckpointError, match=r"layer model.layers.0.mlp.up_proj: qweight: 1 q4_k block"):
        ck.linear("model.layers.0.mlp.up_proj", act_dtype=torch.float32)
