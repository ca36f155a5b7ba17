"""A GGUF re-quantized by ``quantrt quantize --format gguf`` and run by llama.cpp: the same greedy
tokens as quantrt running the same file?

Writes ``--target`` (default gguf-q8_0) from ``--model`` with ``quantrt quantize``, then for each
prompt generates ``--max-new-tokens`` greedy tokens with quantrt (``quantrt run --json``) and with
llama.cpp (``bench/llama_cpp_model.py`` under the llama venv, see its docstring for the build),
both from the written file, and records both token lists, whether they agree, and where they first
part, in two configurations:

- ``defaults``: each engine as it runs out of the box (quantrt's native kernels, which quantize
  activations to 8 bits with fp32 block scales; llama.cpp's f16 KV cache and fp16 activation scales);
- ``fp32``: both with the arithmetic the file defines and nothing rounded beside it (quantrt's
  reference kernel, ``QUANTRT_KERNEL=reference``: fp32 dequantize-then-matmul; llama.cpp with an f32
  KV cache). What is left is llama.cpp's own 8-bit activation blocks.

The source file's own greedy tokens (quantrt, defaults) are recorded beside them, to show what the
re-quantization changed.

    python bench/gguf_requantize.py --model gemma-3-270m-q4_k_m.gguf --llama-python .llama/venv/bin/python \
        --out bench/results/cpu-<date>-gguf-requantize.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cpu_model import PROMPTS, llama_once, quantrt_once

#: (name, quantrt's environment, llama_cpp_model.py's extra arguments)
CONFIGS = (("defaults", {}, ()), ("fp32", {"QUANTRT_KERNEL": "reference"}, ("--kv-type", "f32")))


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b))
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the source GGUF")
    ap.add_argument("--target", default="gguf-q8_0")
    ap.add_argument("--llama-python", required=True, help="python of the venv holding llama-cpp-python")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        written = str(Path(tmp) / "requantized.gguf")
        t0 = time.perf_counter()
        cmd = [sys.executable, "-m", "quantrt", "quantize", args.model, written, "--scheme", args.target]
        summary = json.loads(
            subprocess.run([*cmd, "--json"], capture_output=True, text=True, check=True).stdout
        )
        write_s = time.perf_counter() - t0
        rows = []
        for p in PROMPTS:
            row: dict = {"prompt": p}
            for config, env, extra in CONFIGS:
                ours = quantrt_once(written, p, args.max_new_tokens, args.threads, "fp32", env)
                run = llama_once(args.llama_python, written, p, args.max_new_tokens, args.threads, extra)
                theirs = run["prompts"][0]
                q_ids = ours["token_ids"][ours["prompt_tokens"] :]
                row[config] = {
                    "quantrt_ids": q_ids,
                    "llama_cpp_ids": theirs["ids"],
                    "identical": q_ids == theirs["ids"],
                    "first_difference": first_difference(q_ids, theirs["ids"]),
                    "quantrt_text": ours.get("text"),
                }
                print(
                    f"{p!r:36} {config:8} identical={q_ids == theirs['ids']} first difference={row[config]['first_difference']}"
                )
            source = quantrt_once(args.model, p, args.max_new_tokens, args.threads, "fp32")
            row["source_ids_quantrt"] = source["token_ids"][source["prompt_tokens"] :]
            rows.append(row)
    tree = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    dirty = bool(
        subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True).stdout.strip()
    )
    result = {
        "what": "a GGUF re-quantized by quantrt quantize, greedy tokens of quantrt and llama.cpp on the written file",
        "date": datetime.date.today().isoformat(),
        "machine": run["machine"],
        "llama_cpp": run["llama_cpp"],
        "tree": tree + ("+dirty" if dirty else ""),
        "command": "python bench/gguf_requantize.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        "source": {"path": args.model, "bytes": Path(args.model).stat().st_size},
        "written": {**summary, "write_s": round(write_s, 2)},
        "settings": {
            "threads": args.threads,
            "new_tokens": args.max_new_tokens,
            "quantrt_dtype": "fp32",
            "configs": {c: {"quantrt_env": e, "llama_cpp_args": list(x)} for c, e, x in CONFIGS},
        },
        "prompts": rows,
        "identical": {c: all(r[c]["identical"] for r in rows) for c, _, _ in CONFIGS},
    }
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0 if result["identical"]["fp32"] else 1


if __name__ == "__main__":
    sys.exit(main())
