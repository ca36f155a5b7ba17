"""Whole-model decode and load on the CPU: ``quantrt run`` beside llama.cpp, same GGUF, same prompts,
same threads, rounds alternating so load from other work on the machine hits both alike.

Each round runs, per prompt, one ``quantrt run --json`` process (fp32 activations; greedy, exactly
N new tokens) and one llama.cpp process (``bench/llama_cpp_model.py`` under the llama venv,
``--repeat 1``); each side's figures are medians over the rounds. Both sides time load (quantrt:
``from_pretrained``; llama.cpp: ``Llama(...)`` with mmap), prefill of the prompt, and decode of
tokens 2..N (one token per step, argmax). quantrt's process is started with
``OMP_NUM_THREADS``/``torch.set_num_threads`` at ``--threads``.

    python bench/cpu_model.py --model gemma-3-270m-q4_k_m.gguf --llama-python .llama/venv/bin/python \
        --threads 2 --rounds 5 --out bench/results/cpu-<date>-gemma3-model.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Quantization of neural networks"]


def quantrt_once(
    model: str, prompt: str, new: int, threads: int, dtype: str, env: dict[str, str] | None = None
) -> dict[str, Any]:
    env = {**os.environ, **(env or {}), "OMP_NUM_THREADS": str(threads)}
    cmd = [sys.executable, "-m", "quantrt", "run", model, "--prompt", prompt, "--max-new-tokens", str(new)]
    cmd += ["--ignore-eos", "--dtype", dtype, "--quiet", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
    return json.loads(out)


def llama_once(
    python: str, model: str, prompt: str, new: int, threads: int, extra: tuple[str, ...] = ()
) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [
            python,
            str(Path(__file__).with_name("llama_cpp_model.py")),
            "--model",
            model,
            "--prompt",
            prompt,
        ]
        cmd += ["--max-new-tokens", str(new), "--threads", str(threads), "--repeat", "1", "--out", f.name]
        cmd += list(extra)
        subprocess.run(cmd, capture_output=True, text=True, check=True)
        return json.loads(Path(f.name).read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--llama-python", required=True, help="python of the venv holding llama-cpp-python")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    q: dict[str, list[dict[str, Any]]] = {p: [] for p in PROMPTS}
    ll: dict[str, list[dict[str, Any]]] = {p: [] for p in PROMPTS}
    for r in range(args.rounds):
        for p in PROMPTS:
            q[p].append(quantrt_once(args.model, p, args.max_new_tokens, args.threads, args.dtype))
            ll[p].append(llama_once(args.llama_python, args.model, p, args.max_new_tokens, args.threads))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)

    rows = []
    for p in PROMPTS:
        lp = [x["prompts"][0] for x in ll[p]]
        row = {
            "prompt": p,
            "quantrt": {
                "load_s": statistics.median(x["load_seconds"] for x in q[p]),
                "prefill_tok_s": statistics.median(x["prefill_tokens_per_s"] for x in q[p]),
                "decode_tok_s": statistics.median(x["decode_tokens_per_s"] for x in q[p]),
                "decode_tok_s_rounds": [x["decode_tokens_per_s"] for x in q[p]],
                "peak_host_bytes": statistics.median(x["peak_host_bytes"] for x in q[p]),
                "new_ids": q[p][0]["token_ids"][q[p][0]["prompt_tokens"] :],
                "plan": q[p][0]["plan"],
            },
            "llama_cpp": {
                "load_s": statistics.median(x["load_s"] for x in lp),
                "prefill_tok_s": statistics.median(x["prefill_tok_s"] for x in lp),
                "decode_tok_s": statistics.median(x["decode_tok_s"] for x in lp),
                "decode_tok_s_rounds": [round(x["decode_tok_s"], 2) for x in lp],
                "new_ids": lp[0]["ids"],
            },
        }
        row["decode_ratio"] = row["quantrt"]["decode_tok_s"] / row["llama_cpp"]["decode_tok_s"]
        row["load_ratio"] = row["quantrt"]["load_s"] / row["llama_cpp"]["load_s"]
        rows.append(row)
    git = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    result = {
        "what": "whole-model greedy decode and load on the CPU, quantrt vs llama.cpp, same GGUF",
        "date": datetime.date.today().isoformat(),
        "machine": ll[PROMPTS[0]][0]["machine"],
        "llama_cpp": ll[PROMPTS[0]][0]["llama_cpp"],
        "git": git,
        "model": {"path": args.model, "bytes": Path(args.model).stat().st_size},
        "settings": {
            "threads": args.threads,
            "rounds": args.rounds,
            "new_tokens": args.max_new_tokens,
            "quantrt_dtype": args.dtype,
            "statistic": "median over rounds",
        },
        "command": "python bench/cpu_model.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        "prompts": rows,
        "decode_ratio_range": [min(r["decode_ratio"] for r in rows), max(r["decode_ratio"] for r in rows)],
        "load_ratio_range": [min(r["load_ratio"] for r in rows), max(r["load_ratio"] for r in rows)],
    }
    Path(args.out).write_text(json.dumps(result, indent=1))
    for r in rows:
        print(
            f"{r['prompt']!r:36} quantrt {r['quantrt']['decode_tok_s']:6.1f} tok/s load {r['quantrt']['load_s']:.2f} s"
            f" | llama.cpp {r['llama_cpp']['decode_tok_s']:6.1f} tok/s load {r['llama_cpp']['load_s']:.2f} s"
            f" | decode x{r['decode_ratio']:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
