"""The compressed-tensors writer against checkpoints compressed-tensors 0.20.0 itself wrote
(tests/fixtures/interop): each layer read into canonical form and written back gives the tool's
tensors byte for byte, and the config groups the tool's keys; then a dense model quantized and
written by ``quantrt quantize`` loads back (quantrt's compressed-tensors reader) into the same
model ``from_pretrained(quantize=...)`` builds, logits equal."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from writer_testing import assert_loads_like_online, stored_tensors

import quantrt
from quantrt.checkpoint import open_checkpoint
from quantrt.errors import CheckpointError
from quantrt.writers import compressed_tensors as ct
from quantrt.writers import write_quantized

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "interop"
WRITTEN_BY_THE_TOOL = [
    "ct-pack-w4a16-g128-asym",
    "ct-pack-w4a16-g128-sym",
    "ct-pack-w4a16-ch-asym",
    "ct-pack-w8a16-ch-sym",
    "ct-fp8-w-channel-a-dyntoken",
    "ct-fp8-w-block128-a-dyngroup128",
]
#: keys of a config group's argument sections that only describe how the tool calibrated
TOOL_ONLY = {"observer", "observer_kwargs", "actorder", "block_structure", "scale_dtype", "zp_dtype"}


def _args(section: dict | None) -> dict | None:
    return None if section is None else {k: v for k, v in section.items() if k not in TOOL_ONLY}


@pytest.mark.parametrize("name", WRITTEN_BY_THE_TOOL)
def test_layers_written_back_byte_for_byte(name: str, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    ckpt = open_checkpoint(FIXTURES / name)
    stored = stored_tensors(FIXTURES / name)
    out, schemes, canon = {}, {}, {}
    for prefix, w in ckpt.weights():
        canon[prefix] = w.canonical()
        mine = ct.layer_tensors(prefix, canon[prefix])
        for key, t in mine.items():
            want = stored[key]
            assert t.dtype == want.dtype and t.shape == want.shape, (
                key,
                t.dtype,
                want.dtype,
                t.shape,
                want.shape,
            )
            assert t.is_contiguous() and torch.equal(
                t.flatten().view(torch.uint8), want.flatten().view(torch.uint8)
            ), key
        theirs = {k for k in stored if k.startswith(prefix + ".weight")}
        assert set(mine) == theirs, set(mine) ^ theirs
        out.update(mine)
        schemes[prefix] = w.scheme
    assert schemes
    tool = json.loads((FIXTURES / name / "config.json").read_text())
    dense = [p for p, e in ckpt.layers.items() if not e.quantized and e.kind == "linear"]
    mine = ct.quantization_config(schemes, dense)
    q = tool["quantization_config"]
    assert (mine["format"], mine["ignore"], mine["quant_method"], mine["quantization_status"]) == (
        q["format"], q["ignore"], q["quant_method"], q["quantization_status"]
    )  # fmt: skip
    if len(set(schemes.values())) == 1:  # one group, as the tool writes it
        (g_mine,), (g_tool,) = mine["config_groups"].values(), q["config_groups"].values()
        assert g_mine["targets"] == g_tool["targets"] and g_mine["format"] == g_tool["format"]
        assert _args(g_mine["weights"]) == _args(g_tool["weights"])
        assert _args(g_mine["input_activations"]) == _args(g_tool["input_activations"])
    # read back by quantrt's reader: every layer the same scheme and canonical tensors
    out.update({k: t for k, t in stored.items() if k not in out and not k.startswith(tuple(schemes))})
    save_file(out, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({**tool, "quantization_config": mine}))
    back = dict(open_checkpoint(tmp_path).weights())
    assert set(back) == set(schemes)
    for prefix, w in back.items():
        assert w.scheme == schemes[prefix], prefix
        got = w.canonical()
        assert all(torch.equal(got[k].view(torch.uint8) if got[k].element_size() == 1 else got[k],
                               canon[prefix][k].view(torch.uint8) if got[k].element_size() == 1 else canon[prefix][k])
                   for k in canon[prefix].tensors), prefix  # fmt: skip


@pytest.mark.parametrize(
    "scheme", ["w4a16-int-g128-asym", "w8a16-int-ch-sym", "w8a8-fp8-ch", "w8a8-fp8-block128"]
)
def test_written_checkpoint_loads_as_the_model_quantized_at_load(
    dense_llama: Path, tmp_path: Path, scheme: str
) -> None:
    out = tmp_path / "q"
    summary = write_quantized(dense_llama, out, scheme)
    assert summary["layers"] == {quantrt.parse_scheme(scheme).name: 14} and summary[
        "dense_linear_layers"
    ] == ["lm_head"]
    assert (out / "tokenizer_config.json").exists() and (out / "model.safetensors.index.json").exists()
    cfg = json.loads((out / "config.json").read_text())["quantization_config"]
    assert cfg["quant_method"] == "compressed-tensors"
    assert_loads_like_online(out, dense_llama, scheme, "compressed-tensors")


def test_refusals(dense_llama: Path, tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="compressed-tensors writing covers"):
        write_quantized(dense_llama, tmp_path / "a", "gguf-q4_k")
    with pytest.raises(CheckpointError, match="quantrt writes"):
        write_quantized(dense_llama, tmp_path / "b", "w4a16-int-g128-asym", fmt="exl2")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "x").write_text("")
    with pytest.raises(CheckpointError, match="not empty"):
        write_quantized(dense_llama, tmp_path / "c", "w4a16-int-g128-asym")


def test_cli(dense_llama: Path, tmp_path: Path) -> None:
    out = tmp_path / "cli"
    cmd = [
        sys.executable,
        "-m",
        "quantrt",
        "quantize",
        str(dense_llama),
        str(out),
        "--scheme",
        "w4a16-int-g128-sym",
    ]
    done = subprocess.run([*cmd, "--json"], capture_output=True, text=True, cwd="/tmp", timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)
    assert doc["format"] == "compressed-tensors" and doc["layers"] == {"w4a16-int-g128-sym": 14}
    again = subprocess.run(cmd, capture_output=True, text=True, cwd="/tmp", timeout=600)
    assert again.returncode == 1 and "not empty" in again.stderr and "Traceback" not in again.stderr


def test_mse_search_and_the_error_report(dense_llama: Path, tmp_path: Path) -> None:
    """``OnlineQuantization(search="mse")`` writes the codes ``reference.quantize(search="mse")`` gives;
    the summary's per-layer error is ||W - Q(W)|| / ||W|| of what was written, below plain RTN's."""
    from safetensors.torch import load_file

    from quantrt.formats.online import OnlineQuantization

    dense = {}
    for f in dense_llama.glob("*.safetensors"):
        dense.update(load_file(f))
    plain = write_quantized(dense_llama, tmp_path / "rtn", "w4a16-int-g32-asym")
    spec = OnlineQuantization("w4a16-int-g32-asym", search="mse")
    searched = write_quantized(dense_llama, tmp_path / "mse", spec)
    assert searched["search"] == "mse" and set(searched["relative_error"]) == set(plain["relative_error"])
    for prefix, w in open_checkpoint(tmp_path / "mse").weights():
        c = w.canonical()
        W = dense[prefix + ".weight"].float()
        want = quantrt.reference.quantize(W, "w4a16-int-g32-asym", search="mse")
        for k in ("qweight", "scales", "zeros"):
            assert torch.equal(c[k].cpu(), want[k].to(c[k].dtype)), (prefix, k)
        err = float((quantrt.reference.dequantize(c) - W).norm() / W.norm())
        assert searched["relative_error"][prefix] == pytest.approx(err, abs=2e-6)
        assert searched["relative_error"][prefix] < plain["relative_error"][prefix]
