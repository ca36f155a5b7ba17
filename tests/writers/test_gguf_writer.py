"""The GGUF writer (``quantrt quantize in.gguf out.gguf --scheme gguf-<type>``) against gguf-py and
transformers' GGUF loader, on files llama.cpp's own quantizer wrote (tests/fixtures/gguf) and on
dense files gguf-py wrote here:

- every metadata key and its types come back from gguf-py's reader as they were (the file type
  renamed), tensors in the same order with the same shapes;
- a re-quantized tensor equals gguf-py's own ``quantize(dequantize(source))`` byte for byte for the
  legacy types, and for the K-quants gguf-py's dequantization of the written blocks equals quantrt's;
- a dense F16/BF16/F32 source gives gguf-py's quantization of the same values;
- the written file loads in quantrt and in transformers' GGUF loader to the same logits.

llama.cpp running the re-quantized gemma GGUF is bench/gguf_requantize.py (needs a llama.cpp build).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import quantrt
from quantrt.errors import CheckpointError
from quantrt.formats.online import OnlineQuantization
from quantrt.reference.gguf import dequantize_blocks
from quantrt.writers.gguf import write_gguf

gguf = pytest.importorskip("gguf")
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gguf"
LEGACY = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0")
GT = gguf.GGMLQuantizationType


def _fields(path: Path) -> dict[str, tuple[list, object]]:
    r = gguf.GGUFReader(str(path))
    return {k: (list(f.types), f.contents()) for k, f in r.fields.items() if not k.startswith("GGUF.")}


def _tensors(path: Path) -> dict[str, object]:
    return {t.name: t for t in gguf.GGUFReader(str(path)).tensors}


def _check_against_gguf_py(src: Path, dst: Path, target: str) -> int:
    """Written == gguf-py's re-quantization (legacy) or decodes alike in gguf-py and quantrt (K);
    returns how many tensors changed type."""
    before, after = _tensors(src), _tensors(dst)
    assert list(before) == list(after)
    changed = 0
    for name, t in before.items():
        o = after[name]
        assert list(o.shape) == list(t.shape), name
        data = np.asarray(o.data)
        if o.tensor_type == t.tensor_type:
            assert np.array_equal(data, np.asarray(t.data)), name
            continue
        changed += 1
        assert o.tensor_type == GT[target.upper()], name
        if target in LEGACY:
            want = gguf.quants.quantize(gguf.quants.dequantize(t.data, t.tensor_type), o.tensor_type)
            assert np.array_equal(data.view(np.uint8).reshape(want.shape), want), name
        theirs = gguf.quants.dequantize(o.data, o.tensor_type)
        ours = dequantize_blocks(torch.from_numpy(data.view(np.uint8).copy()), target)
        assert torch.equal(ours.reshape(theirs.shape), torch.from_numpy(theirs)), name
    return changed


@pytest.mark.parametrize(
    ("fixture", "target"),
    [
        ("Q4_K_M", "q8_0"),
        ("Q2_K", "q4_0"),
        ("Q6_K", "q5_1"),
        ("Q8_0", "q4_k"),
        ("Q4_0", "q6_k"),
        ("Q3_K_M", "q5_k"),
    ],
)
def test_requantized_fixture_reads_back_in_gguf_py(fixture: str, target: str, tmp_path: Path) -> None:
    src, dst = FIXTURES / f"tiny-llama-{fixture}.gguf", tmp_path / "out.gguf"
    summary = write_gguf(src, dst, f"gguf-{target}")
    assert summary["tensors"] == {target.upper(): 9}
    assert sorted(summary["copied_as_stored"]) == sorted(
        n for n in _tensors(src) if n.endswith("norm.weight")
    )
    assert _check_against_gguf_py(src, dst, target) == sum(
        t.tensor_type != GT[target.upper()] for n, t in _tensors(src).items() if not n.endswith("norm.weight")
    )
    a, b = _fields(src), _fields(dst)
    assert set(a) == set(b)
    for key in a:
        if key == "general.file_type":
            assert b[key][1] == {"q8_0": 7, "q4_0": 2, "q5_1": 9, "q4_k": 14, "q6_k": 18, "q5_k": 16}[target]
        else:
            assert a[key] == b[key], key


@pytest.mark.parametrize("dtype", [np.float16, np.float32, "bf16"])
def test_dense_source_equals_gguf_py_quantization(dtype: object, tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    w = (rng.standard_normal((48, 96)) * 0.05).astype(np.float32)
    src = tmp_path / "dense.gguf"
    writer = gguf.GGUFWriter(str(src), "llama")
    writer.add_array("tokenizer.ggml.tokens", [b"a", "\u00e9".encode(), b"b\xff"])
    if dtype == "bf16":
        bits = torch.from_numpy(w).to(torch.bfloat16)
        w = bits.float().numpy()
        writer.add_tensor("blk.0.ffn_up.weight", bits.view(torch.uint8).numpy(), raw_dtype=GT.BF16)
    else:
        w = w.astype(dtype).astype(np.float32)
        writer.add_tensor("blk.0.ffn_up.weight", w.astype(dtype))
    writer.add_tensor("blk.0.ffn_norm.weight", np.ones(96, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    dst = tmp_path / "q8.gguf"
    write_gguf(src, dst, "gguf-q8_0")
    t = _tensors(dst)["blk.0.ffn_up.weight"]
    assert t.tensor_type == GT.Q8_0
    assert np.array_equal(np.asarray(t.data).view(np.uint8).reshape(48, -1), gguf.quants.quantize(w, GT.Q8_0))
    tokens = gguf.GGUFReader(str(dst)).fields["tokenizer.ggml.tokens"]
    assert [bytes(tokens.parts[i]) for i in tokens.data][2] == b"b\xff"  # a non-UTF-8 token, byte for byte


def test_overrides_and_skips_by_tensor_name(tmp_path: Path) -> None:
    src, dst = FIXTURES / "tiny-llama-Q4_K_M.gguf", tmp_path / "out.gguf"
    spec = OnlineQuantization(
        "gguf-q8_0", overrides={"blk.0.ffn_down": "gguf-q6_k", "output": None}, skip=("token_embd",)
    )
    summary = write_gguf(src, dst, spec)
    types = {n: t.tensor_type.name for n, t in _tensors(dst).items()}
    before = {n: t.tensor_type.name for n, t in _tensors(src).items()}
    assert types["blk.0.ffn_down.weight"] == "Q6_K" and types["blk.0.attn_q.weight"] == "Q8_0"
    assert types["output.weight"] == before["output.weight"]
    assert types["token_embd.weight"] == before["token_embd.weight"]
    assert summary["tensors"] == {"Q8_0": 6, "Q6_K": 1}
    # more than one written type: the file type is left as the source's
    assert _fields(dst)["general.file_type"][1] == _fields(src)["general.file_type"][1]


def test_written_file_loads_in_quantrt_and_transformers_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """quantrt's reference kernel (fp32 dequantize-then-matmul) beside transformers, which decodes
    the blocks with gguf-py: the same weights, so the same logits (the native Q8_0 kernel quantizes
    activations, as llama.cpp does, and would differ by that)."""
    transformers = pytest.importorskip("transformers")
    monkeypatch.setenv("QUANTRT_KERNEL", "reference")
    dst = tmp_path / "q8.gguf"
    write_gguf(FIXTURES / "tiny-llama-Q4_K_M.gguf", dst, "gguf-q8_0")
    ours = quantrt.from_pretrained(dst, device="cpu", dtype=torch.float32, progress=False)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=dst.name, dtype=torch.float32
    )
    ids = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got, want = ours(ids).logits, theirs(ids).logits
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-4), float((got - want).abs().max())


def test_refusals(tmp_path: Path) -> None:
    src = FIXTURES / "tiny-llama-Q8_0.gguf"
    with pytest.raises(CheckpointError, match="not a GGUF type"):
        write_gguf(src, tmp_path / "a.gguf", "w4a16-int-g128-sym")
    with pytest.raises(CheckpointError, match="no tensor to re-quantize"):
        write_gguf(src, tmp_path / "b.gguf", OnlineQuantization("gguf-q4_0", skip=("*",)))
    assert not (tmp_path / "b.gguf").exists()
    (tmp_path / "c.gguf").write_bytes(b"")
    with pytest.raises(CheckpointError, match="exists"):
        write_gguf(src, tmp_path / "c.gguf", "gguf-q4_0")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(src.read_bytes()[:5000])
    with pytest.raises(CheckpointError, match=r"bad\.gguf"):
        write_gguf(bad, tmp_path / "d.gguf", "gguf-q4_0")


def test_cli(tmp_path: Path) -> None:
    """``quantrt quantize in.gguf out.gguf``: gguf is the default format for a .gguf source; overrides
    by tensor name; a safetensors format asked of a .gguf source is one clear error."""
    from quantrt.cli.quantize import FORMATS
    from quantrt.writers import WRITERS

    assert set(FORMATS) == {*WRITERS, "gguf"}
    src, out = FIXTURES / "tiny-llama-Q4_K_M.gguf", tmp_path / "out.gguf"
    cmd = [sys.executable, "-m", "quantrt", "quantize", str(src), str(out), "--scheme", "gguf-q5_0"]
    done = subprocess.run(
        [*cmd, "--override", "output=gguf-q8_0", "--json"],
        capture_output=True,
        text=True,
        cwd="/tmp",
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)
    assert doc["format"] == "gguf" and doc["tensors"] == {"Q5_0": 8, "Q8_0": 1}
    assert _tensors(out)["output.weight"].tensor_type == GT.Q8_0
    wrong = subprocess.run(
        [*cmd[:5], str(tmp_path / "x"), "--scheme", "w4a16-int-g128-sym", "--format", "gptq"],
        capture_output=True,
        text=True,
        cwd="/tmp",
        timeout=600,
    )
    assert (
        wrong.returncode == 1
        and "re-quantized into a GGUF" in wrong.stderr
        and "Traceback" not in wrong.stderr
    )
