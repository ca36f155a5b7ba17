"""Where one CPU decode step of a whole model goes: quantrt's kernels against everything else.

Loads the model with ``quantrt.from_pretrained``, decodes greedily, and times every
``QuantLinear`` call inside the step (``perf_counter`` around the layer's forward, weights coming
from memory as they do in the model, not from a warm cache as in a layer benchmark); the rest of
the step is transformers' eager model code (norms, rotary, attention, cache, module calls).
Medians over the steps.

    python bench/cpu_decode_split.py --model gemma-3-270m-q4_k_m.gguf --threads 2 \
        --out bench/results/cpu-<date>-gemma3-decode-split.json
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

import quantrt
from quantrt.layers import QuantLinear
from quantrt.models.generate import cache_kwarg
from quantrt.models.tokenizer import load_tokenizer


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", default="The capital of France is")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = quantrt.from_pretrained(args.model, device="cpu", dtype=torch.float32, progress=False)
    spent: collections.Counter[str] = collections.Counter()

    def timed(name: str, forward: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def call(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
            t = time.perf_counter()
            y = forward(x, out)
            spent[name] += time.perf_counter() - t
            return y

        return call

    for name, mod in model.named_modules():
        if isinstance(mod, QuantLinear):
            kind = "lm_head" if name.endswith("lm_head") else name.rsplit(".", 1)[-1]
            mod.forward = timed(kind, mod.forward)
    from transformers import DynamicCache

    kw = cache_kwarg(model)
    steps, splits = [], []
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        ids = load_tokenizer(args.model)(args.prompt, return_tensors="pt")["input_ids"]
        logits = model(input_ids=ids, **{kw: cache}, use_cache=True, logits_to_keep=1).logits
        nxt, pos = int(logits[0, -1].argmax()), ids.shape[1]
        for i in range(args.steps + 4):
            spent.clear()
            t = time.perf_counter()
            tok = torch.tensor([[nxt]])
            logits = model(
                input_ids=tok, **{kw: cache}, cache_position=torch.tensor([pos]), use_cache=True
            ).logits
            nxt, pos = int(logits[0, -1].argmax()), pos + 1
            if i >= 4:  # the first steps warm the allocator and the kernels' workspaces
                steps.append(time.perf_counter() - t)
                splits.append(dict(spent))
    step = statistics.median(steps)
    kernels = {k: statistics.median(s[k] for s in splits) for k in splits[0]}
    total_kernels = statistics.median(sum(s.values()) for s in splits)
    result = {
        "what": "one greedy decode step of a whole model on the CPU, split into quantrt kernels and the rest",
        "date": datetime.date.today().isoformat(),
        "machine": {"cpu": platform.processor() or platform.machine(), "threads": args.threads},
        "git": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
        "command": "python bench/cpu_decode_split.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        "model": {"path": args.model, "bytes": Path(args.model).stat().st_size},
        "plan": model.quantrt.plan_summary(),
        "step_ms": round(step * 1e3, 3),
        "tokens_per_s": round(1 / step, 2),
        "quantrt_kernels_ms": round(total_kernels * 1e3, 3),
        "per_kind_ms": {k: round(v * 1e3, 3) for k, v in sorted(kernels.items())},
        "rest_ms": round((step - total_kernels) * 1e3, 3),
        "statistic": f"median over {args.steps} steps",
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("step_ms", "quantrt_kernels_ms", "per_kind_ms", "rest_ms")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
