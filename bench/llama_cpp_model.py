"""llama.cpp on a whole GGUF model on the CPU: load, prefill and greedy decode of real prompts.

The llama.cpp side of the whole-model benchmark: what our engine's end-to-end figures (and its
generated tokens) are compared against. For each prompt it loads the model ``--repeat`` times and
each time times the load (``Llama(...)``, mmap as llama.cpp does by default), runs one untimed
warm-up generation (the first pass after an mmap load pays the page faults of the weights; that
pass's prefill is kept as ``cold_prefill_s``), clears the KV cache, then times the prompt's
prefill (one ``llama_decode`` of all prompt tokens plus the argmax of the last logits) and the
decode (``N - 1`` one-token ``llama_decode`` calls, each followed by the argmax, that produce
tokens 2..N). Figures are medians over the repeats. Greedy is the argmax of the logits, read
straight from the context (no sampler chain, no penalties); once per prompt the same prompt is
run through llama.cpp's own greedy sampler (``temp=0``) and the two token lists must agree.

The prompt is the raw text, tokenized as llama.cpp does for completion (``add_bos=True``: the
BOS token is added only if the GGUF's ``tokenizer.ggml.add_bos_token`` asks for it; special
tokens in the text are not parsed). No chat template is applied, even when the GGUF ships one:
the JSON records whether BOS was added and whether a template was there. Generation never stops
early: exactly N tokens, and the first end-of-generation token's index (if any) is recorded.

Why in-process llama-cpp-python rather than the ``llama-cli`` binary: it times load, prefill and
each decode step separately on the prompt itself and returns the token ids, with no process
start or text parsing inside the timed regions. The script runs under the llama venv's python
(``llama_cpp`` and numpy only, nothing from quantrt), so llama-cpp-python never enters quantrt's
environment and quantrt's numbers can't leak into these. The commit reported is the one built
into the loaded ``libggml-base`` (``ggml_commit()``), not read from any source tree. As a check
of the decode figure, ``--llama-bench`` runs llama.cpp's own ``llama-bench`` (``-p P -n N``, the
same threads) on the same file and records its pp/tg tokens/s beside ours (its tg starts from an
empty context, ours after the prompt: expect a few percent apart).

Build (``.llama/`` holds the sources, the venv and the binaries; llama-cpp-python's sdist vendors
llama.cpp under ``vendor/llama.cpp``):

    python3 -m venv .llama/venv
    CMAKE_ARGS="-DGGML_NATIVE=ON" .llama/venv/bin/pip install .llama/sdist/llama_cpp_python-0.3.36.tar.gz
    cmake -S <sdist>/vendor/llama.cpp -B .llama/build -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
        && cmake --build .llama/build -j2 --target llama-bench

Usage:

    .llama/venv/bin/python bench/llama_cpp_model.py --model ~/.cache/.../gemma-3-270m-q4_k_m.gguf \
        --prompt "The capital of France is" --prompt "def fibonacci(n):" --max-new-tokens 32 \
        --threads 2 --repeat 5 --llama-bench .llama/build/bin/llama-bench --out F.json
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import gc
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (the platform's processor string elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def llama_build() -> dict[str, str]:
    """llama-cpp-python's version and the ggml version/commit compiled into its libraries."""
    info = {"llama_cpp_python": llama_cpp.__version__, "ggml_version": "?", "ggml_commit": "?"}
    lib = Path(llama_cpp.__file__).parent / "lib"
    for name in ("libggml-base.so", "libggml-base.dylib", "ggml-base.dll"):
        if (lib / name).exists():
            base = ctypes.CDLL(str(lib / name))
            for fn in ("ggml_version", "ggml_commit"):
                if hasattr(base, fn):
                    getattr(base, fn).restype = ctypes.c_char_p
                    info[fn] = getattr(base, fn)().decode()
            break
    info["system_info"] = llama_cpp.llama_print_system_info().decode().strip()
    return info


#: --kv-type -> ggml type id of the KV cache (llama.cpp's default f16)
KV_TYPES = {"f16": 1, "f32": 0}


def load(
    model: str, threads: int, n_ctx: int, flash_attn: bool, mmap: bool, kv_type: str = "f16"
) -> tuple[llama_cpp.Llama, float]:
    """The model and its load time in seconds (everything ``Llama(...)`` does: file, vocab, context)."""
    t0 = time.perf_counter()
    llm = llama_cpp.Llama(
        model_path=model,
        n_ctx=n_ctx,
        n_threads=threads,
        n_threads_batch=threads,
        n_gpu_layers=0,
        flash_attn=flash_attn,
        use_mmap=mmap,
        type_k=KV_TYPES[kv_type],
        type_v=KV_TYPES[kv_type],
        verbose=False,
    )
    return llm, time.perf_counter() - t0


def greedy(llm: llama_cpp.Llama, prompt: list[int], n_new: int) -> tuple[list[int], float, list[float]]:
    """Prefill ``prompt`` from an empty cache, then greedy-decode ``n_new`` tokens. Returns the
    tokens, the prefill time (decode of the prompt + the first argmax) and each later step's time."""
    n_vocab = llm.n_vocab()

    def argmax() -> int:
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,))
        return int(logits.argmax())

    llm.reset()
    t0 = time.perf_counter()
    llm.eval(prompt)
    out = [argmax()]
    prefill = time.perf_counter() - t0
    steps = []
    for _ in range(n_new - 1):
        t0 = time.perf_counter()
        llm.eval([out[-1]])
        out.append(argmax())
        steps.append(time.perf_counter() - t0)
    return out, prefill, steps


def sampler_greedy(llm: llama_cpp.Llama, prompt: list[int], n_new: int) -> list[int]:
    """The same generation through llama.cpp's own greedy sampler (temperature 0, top_k 1)."""
    llm.reset()
    out: list[int] = []
    gen = llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True)
    for tok in gen:
        out.append(int(tok))
        if len(out) == n_new:
            break
    gen.close()
    return out


def bench_prompt(args: argparse.Namespace, prompt: str) -> dict[str, Any]:
    """``args.repeat`` load + warm-up + timed generation runs for one prompt, summarized."""
    loads, prefills, colds, decodes, runs = [], [], [], [], []
    info: dict[str, Any] = {}
    for r in range(args.repeat):
        llm, load_s = load(
            args.model, args.threads, args.ctx, args.flash_attn, not args.no_mmap, args.kv_type
        )
        toks = llm.tokenize(prompt.encode(), add_bos=True, special=False)
        if len(toks) + args.max_new_tokens > args.ctx:
            raise SystemExit(f"prompt ({len(toks)} tokens) + {args.max_new_tokens} exceeds --ctx {args.ctx}")
        _, cold_s, _ = greedy(llm, toks, min(args.max_new_tokens, 4))  # warm-up: page faults, allocations
        ids, prefill_s, steps = greedy(llm, toks, args.max_new_tokens)
        decode_s = sum(steps)
        loads.append(load_s)
        colds.append(cold_s)
        prefills.append(len(toks) / prefill_s)
        decodes.append(len(steps) / decode_s if steps else float("nan"))
        runs.append({"ids": ids, "load_s": load_s, "prefill_s": prefill_s, "decode_s": decode_s})
        if r == 0:
            eog = [i for i, t in enumerate(ids) if llama_cpp.llama_vocab_is_eog(llm._model.vocab, t)]
            sampler_ids = sampler_greedy(llm, toks, args.max_new_tokens)
            meta = llm.metadata
            info = {
                "prompt_ids": toks,
                "bos_id": llm.token_bos(),
                "bos_added": bool(toks) and toks[0] == llm.token_bos(),
                "gguf_add_bos_token": meta.get("tokenizer.ggml.add_bos_token"),
                "chat_template_in_gguf": "tokenizer.chat_template" in meta,
                "chat_template_applied": False,
                "first_eog_index": eog[0] if eog else None,
                "sampler_greedy_ids": sampler_ids,
                "sampler_agrees": sampler_ids == ids,
                "text": llm.detokenize(ids).decode("utf-8", errors="replace"),
                "model_meta": {
                    k: meta.get(k)
                    for k in (
                        "general.architecture",
                        "general.name",
                        "general.file_type",
                        "general.size_label",
                    )
                },
            }
        llm.close()
        del llm
        gc.collect()
    same = all(run["ids"] == runs[0]["ids"] for run in runs)
    return {
        "prompt": prompt,
        "prompt_tokens": len(info["prompt_ids"]),
        "new_tokens": args.max_new_tokens,
        "load_s": statistics.median(loads),
        "cold_prefill_s": statistics.median(colds),
        "prefill_tok_s": statistics.median(prefills),
        "decode_tok_s": statistics.median(decodes),
        "decode_ms_per_token": 1e3 / statistics.median(decodes),
        "ids": runs[0]["ids"],
        "ids_same_every_run": same,
        **info,
        "runs": runs,
    }


def llama_bench(binary: str, model: str, threads: int, pp: int, tg: int, reps: int) -> dict[str, Any]:
    """llama.cpp's own ``llama-bench`` on the same file: prefill of ``pp`` and decode of ``tg`` tokens."""
    cmd = [
        binary,
        "-m",
        model,
        "-p",
        str(pp),
        "-n",
        str(tg),
        "-t",
        str(threads),
        "-r",
        str(reps),
        "-o",
        "json",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    rows = json.loads(res.stdout)
    out: dict[str, Any] = {"command": shlex.join(cmd)}
    for row in rows:
        key = "prefill" if row["n_prompt"] else "decode"
        out[key] = {
            "tok_s": row["avg_ts"],
            "stddev": row["stddev_ts"],
            "tokens": row["n_prompt"] or row["n_gen"],
        }
        out["build"] = f"{row.get('build_commit', '?')} ({row.get('build_number', '?')})"
        out["flash_attn"] = row.get("flash_attn")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="GGUF file")
    ap.add_argument("--prompt", action="append", required=True, help="prompt text (repeat for several)")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5, help="loads + timed runs per prompt (medians)")
    ap.add_argument("--ctx", type=int, default=512, help="context size (KV cache)")
    ap.add_argument(
        "--flash-attn", action="store_true", help="flash attention (llama-cpp-python's default: off)"
    )
    ap.add_argument("--no-mmap", action="store_true", help="read the weights into memory instead of mmap")
    ap.add_argument("--kv-type", choices=sorted(KV_TYPES), default="f16", help="KV cache type (default f16)")
    ap.add_argument(
        "--llama-bench", help="llama-bench binary: also record its pp/tg figures on the same file"
    )
    ap.add_argument("--out", help="write the results JSON here")
    args = ap.parse_args()
    if args.max_new_tokens < 1:
        raise SystemExit("--max-new-tokens must be at least 1")
    args.model = str(Path(args.model).expanduser())

    results = []
    for prompt in args.prompt:
        print(f"prompt {prompt!r}: {args.repeat} runs", file=sys.stderr)
        results.append(bench_prompt(args, prompt))
    bench = None
    if args.llama_bench:
        pp = results[0]["prompt_tokens"]
        bench = llama_bench(args.llama_bench, args.model, args.threads, pp, args.max_new_tokens, args.repeat)

    print(
        f"\n{'prompt':<34} {'tokens':>6} {'load s':>7} {'prefill tok/s':>13} {'decode tok/s':>12}  same/agree"
    )
    for r in results:
        print(
            f"{r['prompt'][:34]:<34} {r['prompt_tokens']:>6} {r['load_s']:>7.3f} {r['prefill_tok_s']:>13.1f}"
            f" {r['decode_tok_s']:>12.1f}  {r['ids_same_every_run']}/{r['sampler_agrees']}"
        )
        print(f"  ids  {r['ids']}\n  text {r['text']!r}")
    if bench:
        print(
            f"llama-bench: pp{bench['prefill']['tokens']} {bench['prefill']['tok_s']:.1f} tok/s,"
            f" tg{bench['decode']['tokens']} {bench['decode']['tok_s']:.1f} tok/s ({bench['build']})"
        )

    doc = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "threads": args.threads},
        "llama_cpp": llama_build(),
        "settings": {
            "n_ctx": args.ctx,
            "flash_attn": args.flash_attn,
            "kv_type": args.kv_type,
            "mmap": not args.no_mmap,
            "greedy": "argmax of the last logits; checked against llama.cpp's greedy sampler",
            "prefill": "one llama_decode of the prompt + argmax",
            "decode": "N-1 one-token llama_decode + argmax steps (tokens 2..N)",
            "warmup": "one untimed generation after each load",
        },
        "model": {"path": args.model, "bytes": Path(args.model).stat().st_size},
        "command": shlex.join([sys.executable, *sys.argv]),
        "prompts": results,
        "llama_bench": bench,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1))
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
