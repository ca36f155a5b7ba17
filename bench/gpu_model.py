"""Whole-model decode on a GPU: quantrt (eager and CUDA graphs) beside transformers bf16 on the
dequantized model, on a GGUF laid out exactly as a real one.

The lent GPU machine has no network and a 64 MiB limit on what travels to it, so the real file
(gemma-3-270m Q4_K_M, 253 MB) cannot go there. ``bench/layouts/<model>.json`` records that file's
metadata (minus the tokenizer) and every tensor's name, ggml type and dims; this script writes a
GGUF with the same layout and random valid blocks (``quantrt.reference.gguf.random_blocks``:
weight-like f16 scales, random codes; norms 1.0), so every layer has the real type and shape and
the kernels do the real work. Tokens are meaningless and generation never stops early
(``ignore_eos``): the figure is tokens per second.

Both sides run the same greedy loop (``quantrt.models.generate.greedy``) from the same prompt ids,
eager (DynamicCache) and with a static cache replayed as one CUDA graph per token; transformers'
model is its own GGUF loader's (``from_pretrained(gguf_file=...)``: dequantized, bf16 on the GPU).
Each configuration: one warm-up generation, then ``--repeat`` timed ones; medians reported.

    python3 bench/gpu_model.py --layout bench/layouts/gemma-3-270m-q4_k_m.json --out F.json
    python3 bench/gpu_model.py --layout ... --prompt-tokens 4096 --kv-caches none,fp8,turboquant_4bit_nc --out F.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch


def write_gguf(layout: dict[str, Any], path: Path) -> None:
    import gguf

    from quantrt.reference.gguf import BLOCK, random_blocks

    meta = layout["metadata"]
    w = gguf.GGUFWriter(str(path), meta["general.architecture"])
    for key, value in meta.items():
        if key == "general.architecture":
            continue
        kind = layout["metadata_types"][key].lower()
        if kind == "string":
            w.add_string(key, value)
        elif kind == "array":
            w.add_array(key, value)
        elif kind == "f32":
            w.add_float32(key, value)
        else:
            w.add_uint32(key, value)
    for i, (name, (tname, dims)) in enumerate(layout["tensors"].items()):
        t = tname.lower()
        if t in BLOCK:
            K, N = dims[0], int(np.prod(dims[1:]))
            data = random_blocks(t, N, K, seed=i).numpy()
            w.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[tname])
        else:
            w.add_tensor(name, np.ones(list(reversed(dims)), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def timed(
    model: Any, prompt: list[int], new: int, graphs: bool, repeat: int, kv: str | None = None
) -> dict[str, Any]:
    from quantrt.models.generate import greedy

    greedy(model, prompt, new, ignore_eos=True, cuda_graphs=graphs, kv_cache=kv)
    runs = [
        greedy(model, prompt, new, ignore_eos=True, cuda_graphs=graphs, kv_cache=kv) for _ in range(repeat)
    ]
    return {
        "cuda_graphs": graphs,
        "kv_cache": runs[0].kv_cache,
        "decode_tok_s": statistics.median(r.decode_tps for r in runs),
        "decode_tok_s_runs": [round(r.decode_tps, 1) for r in runs],
        "prefill_s": statistics.median(r.prefill_s for r in runs),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layout", required=True)
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--kv-caches",
        default="",
        help="comma-separated KV caches (none,fp8,int8,turboquant_4bit_nc,...): quantrt alone with each, "
        "eager and CUDA graphs, instead of the transformers comparison (use a long --prompt-tokens)",
    )
    args = ap.parse_args()

    import transformers

    import quantrt
    from quantrt.bench import run_header

    layout = json.loads(Path(args.layout).read_text())
    result: dict[str, Any] = run_header(
        "whole-model decode, quantrt vs transformers bf16", "bench/gpu_model.py", args
    )
    result["model"] = layout["source"] + " layout, random valid blocks"
    prompt = list(range(2, 2 + args.prompt_tokens))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.gguf"
        write_gguf(layout, path)
        result["file_bytes"] = path.stat().st_size
        t0 = time.perf_counter()
        q = quantrt.from_pretrained(path, device="cuda", dtype=torch.bfloat16, progress=False)
        torch.cuda.synchronize()
        result["quantrt"] = {"load_s": time.perf_counter() - t0, "plan": q.quantrt.plan_summary()}
        if args.kv_caches:
            result["what"] = "whole-model decode, quantrt with each KV cache"
            result["kv"] = {}
            for kv in args.kv_caches.split(","):
                result["kv"][kv] = {}
                for mode in ("eager", "graphs"):
                    try:
                        result["kv"][kv][mode] = timed(
                            q, prompt, args.new_tokens, mode == "graphs", args.repeat, kv
                        )
                    except RuntimeError as e:  # transformers' static sliding-window layers cannot be
                        # captured once the prompt passes the window: recorded, the rest still runs
                        result["kv"][kv][mode] = {
                            "error": str(e).splitlines()[0],
                            "decode_tok_s": float("nan"),
                        }
                    torch.cuda.synchronize()
                Path(args.out).write_text(json.dumps(result, indent=1))
                print(kv, {m: round(r["decode_tok_s"], 1) for m, r in result["kv"][kv].items()}, flush=True)
            return 0
        result["quantrt"]["eager"] = timed(q, prompt, args.new_tokens, False, args.repeat)
        result["quantrt"]["graphs"] = timed(q, prompt, args.new_tokens, True, args.repeat)
        result["quantrt"]["gpu_bytes"] = torch.cuda.max_memory_allocated()
        del q
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        hf = transformers.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.bfloat16
        ).to("cuda")
        torch.cuda.synchronize()
        result["transformers_bf16"] = {"load_s": time.perf_counter() - t0}
        result["transformers_bf16"]["eager"] = timed(hf.eval(), prompt, args.new_tokens, False, args.repeat)
        result["transformers_bf16"]["graphs"] = timed(hf, prompt, args.new_tokens, True, args.repeat)
        result["transformers_bf16"]["gpu_bytes"] = torch.cuda.max_memory_allocated()
    for mode in ("eager", "graphs"):
        result[f"ratio_{mode}"] = (
            result["quantrt"][mode]["decode_tok_s"] / result["transformers_bf16"][mode]["decode_tok_s"]
        )
    result["ratio_graphs_vs_transformers_eager"] = (
        result["quantrt"]["graphs"]["decode_tok_s"] / result["transformers_bf16"]["eager"]["decode_tok_s"]
    )
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "versions"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
