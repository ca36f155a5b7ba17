"""Bad checkpoints as models: one clear quantrt error each, naming the file and what was expected
and found, and no half-loaded model left alive. Also ``quantrt run`` on the fixtures, end to end."""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import quantrt
from quantrt.models.generate import greedy

transformers = pytest.importorskip("transformers")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SAFETENSORS = FIXTURES / "interop" / "gptqmodel-gptq-w4g128-asym-v2"
GGUF = FIXTURES / "gguf" / "tiny-llama-Q8_0.gguf"


def live_models() -> int:
    gc.collect()
    return sum(isinstance(o, transformers.PreTrainedModel) for o in gc.get_objects())


def copy_fixture(tmp_path: Path) -> Path:
    d = tmp_path / "ckpt"
    shutil.copytree(SAFETENSORS, d)
    (d / "reference.safetensors").unlink()
    return d


def weights_file(d: Path) -> Path:
    (f,) = [p for p in d.glob("*.safetensors")]
    return f


def refuse(path: Path, match: str) -> None:
    before = live_models()
    with pytest.raises(quantrt.CheckpointError, match=match):
        quantrt.from_pretrained(path, device="cpu", dtype=torch.float32, progress=False)
    assert live_models() == before  # nothing half-loaded stays behind


def test_config_wider_than_the_tensors(tmp_path: Path) -> None:
    d = copy_fixture(tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["intermediate_size"] *= 2
    (d / "config.json").write_text(json.dumps(cfg))
    refuse(d, r"layer model\.layers\.0\.mlp\.gate_proj: the config makes it \d+x\d+ .*stores \d+x\d+")


def test_more_layers_in_the_config_than_stored(tmp_path: Path) -> None:
    d = copy_fixture(tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_hidden_layers"] += 1
    (d / "config.json").write_text(json.dumps(cfg))
    refuse(d, r"stores no tensor for \d+ parameter\(s\).*model\.layers\.1\.")


def test_a_tensor_nothing_reads(tmp_path: Path) -> None:
    d = copy_fixture(tmp_path)
    f = weights_file(d)
    tensors = load_file(f)
    tensors["model.layers.0.mystery.weight"] = torch.randn(4, 4)
    save_file(tensors, f, metadata={"format": "pt"})
    refuse(d, r"1 stored tensor\(s\) belong to nothing .*model\.layers\.0\.mystery\.weight")


def test_a_norm_of_the_wrong_shape(tmp_path: Path) -> None:
    d = copy_fixture(tmp_path)
    f = weights_file(d)
    tensors = load_file(f)
    tensors["model.norm.weight"] = torch.randn(tensors["model.norm.weight"].numel() + 1)
    save_file(tensors, f, metadata={"format": "pt"})
    refuse(d, r"model\.norm\.weight.*expected shape \[\d+\] for model\.norm\.weight .*found \[\d+\]")


def test_missing_config(tmp_path: Path) -> None:
    d = copy_fixture(tmp_path)
    (d / "config.json").unlink()
    with pytest.raises(quantrt.QuantrtError):
        quantrt.from_pretrained(d, device="cpu", progress=False)


def test_missing_tokenizer_is_one_clear_error() -> None:
    from quantrt.models.tokenizer import load_tokenizer

    with pytest.raises(quantrt.CheckpointError, match=r"tiny-llama-Q8_0\.gguf: no tokenizer in the file"):
        load_tokenizer(GGUF)
    with pytest.raises(quantrt.CheckpointError, match=r"no tokenizer files \(looked for tokenizer\.json"):
        load_tokenizer(SAFETENSORS)


def quantrt_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, "-m", "quantrt", *args], capture_output=True, text=True, env=env, timeout=600
    )


def test_run_without_tokenizer_says_so() -> None:
    r = quantrt_cli("run", str(GGUF), "--prompt", "hello", "--json")
    assert r.returncode == 1
    err = json.loads(r.stdout)
    assert err["error"] == "CheckpointError" and "no tokenizer in the file" in err["message"]


@pytest.mark.parametrize("path", [GGUF, SAFETENSORS], ids=["gguf", "gptq"])
def test_run_json_and_check(path: Path) -> None:
    r = quantrt_cli(
        "run", str(path), "--prompt-ids", "1,2,3", "--max-new-tokens", "5", "--ignore-eos", "--check"
    )
    assert r.returncode == 0 and "decode 5 tokens" in r.stdout and "plan" in r.stdout, r.stdout + r.stderr
    r = quantrt_cli(
        "run",
        str(path),
        "--prompt-ids",
        "1,2,3",
        "--max-new-tokens",
        "5",
        "--ignore-eos",
        "--check",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["token_ids"][:3] == [1, 2, 3] and out["new_tokens"] == 5
    assert out["check"]["ok"] and out["check"]["rel_err"] <= out["check"]["tolerance"]
    assert sum(out["plan"].values()) >= 7 and out["load_seconds"] > 0 and out["decode_tokens_per_s"] > 0
    assert out["peak_host_bytes"] > 0 and out["checkpoint_bytes"] > 0
    model = quantrt.from_pretrained(path, device="cpu", progress=False)
    want = greedy(model, [1, 2, 3], 5, ignore_eos=True).tokens
    assert out["token_ids"] == want
