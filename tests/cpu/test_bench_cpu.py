"""The CPU benchmark harness: rows hold the times they report, ratios follow from them, prepared
bytes come from the kernel's storages, and the CLI writes the JSON."""

import dataclasses
import itertools
import json
import subprocess
import sys
import time

import torch

from quantrt import bench_cpu


@dataclasses.dataclass
class _State:
    a: torch.Tensor
    parts: tuple


def test_state_bytes_counts_each_storage_once():
    a = torch.zeros(100, dtype=torch.uint8)
    b = torch.zeros(10, dtype=torch.float32)
    st = _State(a, (a[10:], {"b": b, "view": b.view(2, 5)}, [None, 3]))
    assert bench_cpu.state_bytes(st) == 100 + 40


def test_interleaved_timing_runs_every_function_in_each_round():
    """Rounds alternate the functions (a slow stretch of the machine hits them alike), and each
    median is its own function's cost: a call that sleeps 2 ms measures at least that, one that
    sleeps 4 ms at least 4 and more than the first."""
    calls: list[str] = []

    def make(name: str, s: float):
        def fn() -> None:
            calls.append(name)
            time.sleep(s)

        return fn

    t = bench_cpu.interleaved_ms({"a": make("a", 0.002), "b": make("b", 0.004)}, min_s=0.06, reps=3)
    assert t["a"] >= 1.99 and t["b"] >= 3.99 and t["b"] > t["a"], t
    timed = calls[4:]  # two warm-up calls each first
    switches = sum(1 for u, v in itertools.pairwise(timed) if u != v)
    assert switches >= 5, calls  # a, b, a, b, a, b blocks: the rounds interleave


def test_run_cpu_rows_are_consistent():
    doc = bench_cpu.run_cpu(["w4a16-int-g128-sym"], [(256, 48)], [1, 3], progress=lambda s: None)
    assert [r["M"] for r in doc["rows"]] == [1, 3]
    for r in doc["rows"]:
        assert r["quantrt_ms"] > 0 and r["dense_bf16_ms"] > 0
        assert (
            abs(r["vs_dense_bf16"] - r["dense_bf16_ms"] / r["quantrt_ms"]) < 1e-3 * r["vs_dense_bf16"] + 1e-3
        )
    (load,) = doc["load"]
    assert load["stored_MB"] > 0 and load["prepared_vs_stored"] > 0
    assert doc["threads"] == torch.get_num_threads()
    assert "| w4a16-int-g128-sym | 256x48 | 1 |" in bench_cpu.markdown_cpu(doc)


def test_cli_writes_the_json(tmp_path):
    out = tmp_path / "b.json"
    cmd = [sys.executable, "-m", "quantrt", "bench", "--device", "cpu", "--schemes", "w8a16-int-ch-sym"]
    cmd += ["--shapes", "128x32", "--ms", "1", "--threads", "1", "--out", str(out), "--json"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    doc = json.loads(out.read_text())
    assert doc["threads"] == 1 and doc["rows"][0]["K"] == 128 and doc["rows"][0]["N"] == 32
    bad = subprocess.run([*cmd[:8], "--shapes", "12by3"], capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "expected KxN" in bad.stderr
