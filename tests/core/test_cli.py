"""The quantrt command, run as a user runs it (a subprocess), including its error paths."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from quantrt.capability import probe


def quantrt(*args: str, env: dict[str, str] | None = None, cwd: str = "/") -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("QUANTRT_")}
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "quantrt", *args],
        capture_output=True,
        text=True,
        env=full,
        cwd=cwd,
        timeout=300,
    )


def test_probe_json_reports_this_cpu() -> None:
    r = quantrt("probe", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    cpu = doc["cpu"]
    assert cpu["kind"] == "cpu" and cpu["arch"] == "x86_64" and cpu["cores"] >= 1
    assert doc["origin"] == "probe" and doc["torch_version"].startswith("2.")
    assert "_int_mm" in cpu["torch_ops"]


@pytest.mark.parametrize(
    "preset,device_word,kernel",
    [
        ("mi300x", "gfx942", "rocm.torch_scaled_mm_fnuz"),
        ("h100", "sm_90", "cuda.torch_tinygemm"),
        ("spr-amx", "x86_64", "cpu.torch_int4pack"),
    ],
)
def test_explain_under_presets(preset: str, device_word: str, kernel: str) -> None:
    r = quantrt(
        "explain",
        "--scheme",
        "w4a16-int-g128-asym",
        "--shape",
        "4096x4096",
        env={"QUANTRT_CAPABILITIES": preset},
    )
    assert r.returncode == 0, r.stderr
    assert f"[preset:{preset}]" in r.stdout and device_word in r.stdout
    assert kernel in r.stdout  # every candidate is listed with its verdict
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("  ")]
    assert len(lines) >= 2 and all(
        ("chosen" in ln or "rejected: requires" in ln or "also supports" in ln or "skipped" in ln)
        for ln in lines
    )
    j = quantrt(
        "explain", "--scheme", "w4a16-int-g128-asym", "--shape", "4096x4096", "--as", preset, "--json"
    )
    doc = json.loads(j.stdout)
    assert doc["capabilities"] == f"preset:{preset}" and doc["candidates"]
    assert all({"kernel", "status", "predicate", "values", "reason"} <= set(c) for c in doc["candidates"])


def test_explain_all_prints_the_catalog_plan() -> None:
    r = quantrt("explain", "--scheme", "all", "--as", "h100", "--json")
    plans = json.loads(r.stdout)["plans"]
    assert plans["w8a8-fp8-ch"] == "cuda.triton_fp8" and plans["gguf-q4_k"] == "cuda.mma_gguf"
    assert plans["w3a16-int-g128-asym"] == "cuda.mma_w2w3"
    assert plans["w4a8-int-g128-sym-afp8"] == "no native kernel yet"


def test_errors_are_one_clear_line(tmp_path: Path) -> None:
    r = quantrt("explain", "--scheme", "w4a16-int-g100x-asym", "--shape", "4096x4096")
    assert r.returncode == 1 and "part 3 'g100x' is not understood" in r.stderr
    r = quantrt("explain", "--scheme", "w4a16-int-g128-asym", "--as", "h300")
    assert r.returncode == 1 and "'h300' is neither a capability preset" in r.stderr and "h100" in r.stderr
    bad = tmp_path / "caps.json"
    bad.write_text("{not json")
    r = quantrt("explain", "--scheme", "w4a16-int-g128-asym", env={"QUANTRT_CAPABILITIES": str(bad)})
    assert r.returncode == 1 and "caps.json" in r.stderr and "line 1" in r.stderr
    r = quantrt(
        "explain",
        "--scheme",
        "w4a16-int-g128-asym",
        "--shape",
        "256x64",
        "--device",
        "cpu",
        env={"QUANTRT_KERNEL": "cpu.torch_int8pack"},
    )
    assert r.returncode == 1
    assert "QUANTRT_KERNEL='cpu.torch_int8pack' cannot implement" in r.stderr
    assert "requires symmetric 8-bit integer weights" in r.stderr
    r = quantrt("explain", "--scheme", "w4a16-int-g128-asym", "--shape", "4096by4096", "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["error"] == "ConfigError"


def test_run_embedded_default_checks_against_reference() -> None:
    r = quantrt(
        "run", "--schemes", "w8a16-int-ch-sym,w4a16-int-g128-asym", "--m", "1,5", "--repeat", "2", "--json"
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["model"] == [
        {"name": "q_proj", "K": 4096, "N": 4096},
        {"name": "up_proj", "K": 4096, "N": 14336},
    ]
    got = {(row["scheme"], row["M"]): row for row in doc["results"]}
    assert set(got) == {(s, m) for s in ("w8a16-int-ch-sym", "w4a16-int-g128-asym") for m in (1, 5)}
    # the native CPU kernels where this CPU has AVX-512 BF16 (the CI machines do), torch's packed ops otherwise
    # (their AMX subclass where the CPU has AMX tiles)
    cpu = probe().cpu
    native = cpu.has("avx512f", "avx512bw", "avx512vl", "avx512_bf16")
    wint = "cpu.amx_wint" if cpu.has("amx_bf16", "amx_tile") else "cpu.native_wint"
    assert got[("w4a16-int-g128-asym", 1)]["kernel"] == (wint if native else "cpu.torch_int4pack")
    assert got[("w8a16-int-ch-sym", 5)]["kernel"] == (wint if native else "cpu.torch_int8pack")
    for row in doc["results"]:
        assert row["ok"] and 0 < max(row["errors"].values()) < doc["tolerance"]
        assert row["ms"] > 0 and row["dense_ms"] > 0
