"""Load-and-quantize time and peak memory of a dense checkpoint (``from_pretrained(quantize=S)``),
beside loading the same checkpoint dense, each in a fresh process.

A Llama-shaped checkpoint of random bf16 weights is written first (``--shape 1b``: Llama 3.2 1B's
layout, 2.5 GB; ``8b``: Llama 3.1 8B's, 16 GB; the weights are random, the sizes real), then each
configuration loads it in its own process: wall time (from after the imports, on a GPU the CUDA
context, and a warm-up load of a tiny checkpoint of the same layout and scheme, whose time is
reported as ``warmup_s``: what transformers imports lazily and each kernel's first call cost once
per process, not per byte; ``--cold`` times without it), peak host RSS above the imports, peak GPU memory, and the throughput in GB/s of bf16
input. The quantized model's bytes say what "final size
+ two dense layers" is for that run.

    python bench/quantize_load.py --shape 1b --schemes w4a16-int-g128-asym --device cpu --out r.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SHAPES = {  # hidden, intermediate, layers, heads, kv heads, vocab, tied embeddings
    "tiny": (256, 768, 2, 4, 2, 1024, True),
    "1b": (2048, 8192, 16, 32, 8, 128256, True),
    "8b": (4096, 14336, 32, 32, 8, 128256, False),
}

CHILD = r"""
import json, sys, time, resource, torch
import transformers, quantrt  # imported before the baseline: the peak is the model's, not the code's
def hwm():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmHWM"))
path, device, scheme, profile, warm = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
if device.startswith("cuda"):  # the CUDA context is the process's, not the load's
    torch.empty(1, device=device)
    torch.cuda.synchronize()
warmup_s = None
if warm:  # a tiny checkpoint of the same layout and scheme first: the imports transformers makes
    # lazily and each kernel's first call are the process's, not the load's (reported apart)
    t0 = time.perf_counter()
    quantrt.from_pretrained(warm, device=device, dtype=torch.bfloat16, progress=False,
                            quantize=None if scheme in ("dense", "stored") else scheme)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    warmup_s = time.perf_counter() - t0
base = hwm()
if profile:
    import cProfile
    prof = cProfile.Profile()
    prof.enable()
t0 = time.perf_counter()
model = quantrt.from_pretrained(path, device=device, dtype=torch.bfloat16, progress=False,
                                quantize=None if scheme in ("dense", "stored") else scheme)
if device.startswith("cuda"):
    torch.cuda.synchronize()
dt = time.perf_counter() - t0
if profile:
    import io, pstats
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
    open(profile, "w").write(text.getvalue())
import dataclasses
def nbytes(obj, depth=0):
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if depth > 3:
        return 0
    if isinstance(obj, dict):
        vals = list(obj.values())
    elif isinstance(obj, (list, tuple)):
        vals = list(obj)
    elif dataclasses.is_dataclass(obj):
        vals = [getattr(obj, f.name) for f in dataclasses.fields(obj)]
    else:
        vals = list(vars(obj).values()) if hasattr(obj, "__dict__") and not callable(obj) else []
    return sum(nbytes(v, depth + 1) for v in vals)
state = sum(nbytes(m._state.layout) for m in model.modules() if getattr(m, "_state", None) is not None)
params = sum(p.numel() * p.element_size() for p in model.parameters())
print(json.dumps({"load_s": dt, "warmup_s": warmup_s, "peak_host_above_imports": hwm() - base,
                  "peak_gpu": torch.cuda.max_memory_allocated() if device.startswith("cuda") else None,
                  "quantized_state_bytes": state, "dense_param_bytes": params,
                  "plan": model.quantrt.plan_summary()}))
"""


def write_checkpoint(path: Path, shape: str) -> int:
    """A Llama-shaped dense checkpoint of random bf16 weights in ~1 GB shards; returns its bytes."""
    import torch
    from safetensors.torch import save_file

    H, FF, L, NH, KV, V, tied = SHAPES[shape]
    D = H // NH
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H,
        "intermediate_size": FF, "num_hidden_layers": L, "num_attention_heads": NH,
        "num_key_value_heads": KV, "head_dim": D, "vocab_size": V, "tie_word_embeddings": tied,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "torch_dtype": "bfloat16", "hidden_act": "silu",
    }  # fmt: skip
    (path / "config.json").write_text(json.dumps(config))
    g = torch.Generator().manual_seed(0)
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,)}
    if not tied:
        shapes["lm_head.weight"] = (V, H)
    for i in range(L):
        p = f"model.layers.{i}."
        shapes.update({
            p + "self_attn.q_proj.weight": (NH * D, H), p + "self_attn.k_proj.weight": (KV * D, H),
            p + "self_attn.v_proj.weight": (KV * D, H), p + "self_attn.o_proj.weight": (H, NH * D),
            p + "mlp.gate_proj.weight": (FF, H), p + "mlp.up_proj.weight": (FF, H), p + "mlp.down_proj.weight": (H, FF),
            p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
        })  # fmt: skip
    shard: dict[str, Any] = {}
    size, n, weight_map, total = 0, 0, {}, 0
    names = list(shapes)
    for k, name in enumerate(names):
        s = shapes[name]
        t = (
            torch.ones(s, dtype=torch.bfloat16)
            if len(s) == 1
            else (torch.randn(s, generator=g) * 0.02).bfloat16()
        )
        shard[name], size = t, size + t.numel() * 2
        if size > 1 << 30 or k == len(names) - 1:
            file = f"model-{n:05d}.safetensors"
            save_file(shard, str(path / file), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(shard, file))
            total += size
            shard, size, n = {}, 0, n + 1
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="1b")
    ap.add_argument("--schemes", default="w4a16-int-g128-asym,w8a8-fp8-ch")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", required=True)
    ap.add_argument("--dir", default=None, help="where to write the checkpoint (default: a temporary folder)")
    ap.add_argument("--profile-dir", default=None, help="write each load's cProfile (by own time) here")
    ap.add_argument(
        "--cold",
        action="store_true",
        help="no warm-up load: the timed load also pays the lazy imports and each kernel's first call "
        "(by default a tiny checkpoint of the same layout and scheme is loaded first, its time reported "
        "as warmup_s)",
    )
    args = ap.parse_args()
    import torch

    doc: dict[str, Any] = {
        "what": "dense checkpoint loaded dense vs quantized at load (from_pretrained(quantize=...))",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": "python " + " ".join(sys.argv),
        "shape": args.shape,
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "torch": torch.__version__,
        "tree": os.environ.get("QUANTRT_TREE")
        or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent
        ).stdout.strip(),
        "rows": [],
    }
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp) / "dense"
        path.mkdir()
        t0 = time.perf_counter()
        doc["checkpoint_bytes"] = write_checkpoint(path, args.shape)
        doc["write_s"] = time.perf_counter() - t0
        tiny = Path(tmp) / "tiny"
        tiny.mkdir()
        write_checkpoint(tiny, "tiny")
        runs = [("dense", path, "dense", tiny)]
        from quantrt.writers import write_quantized

        for scheme in args.schemes.split(","):
            runs.append((scheme, path, scheme, tiny))
            # the same scheme written by ``quantrt quantize`` (compressed-tensors), loaded as stored
            written = path.parent / f"{path.name}-{scheme}"
            t0 = time.perf_counter()
            write_quantized(path, written, scheme, device=args.device)
            doc.setdefault("quantize_write_s", {})[scheme] = time.perf_counter() - t0
            tiny_written = tiny.parent / f"tiny-{scheme}"
            write_quantized(tiny, tiny_written, scheme, device=args.device)
            runs.append((f"{scheme} (written, loaded as stored)", written, "stored", tiny_written))
        for i, (label, where, scheme, warm) in enumerate(runs):
            if args.profile_dir:
                Path(args.profile_dir).mkdir(parents=True, exist_ok=True)
            profile = str(Path(args.profile_dir) / f"profile-{i}.txt") if args.profile_dir else ""
            done = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    CHILD,
                    str(where),
                    args.device,
                    scheme,
                    profile,
                    "" if args.cold else str(warm),
                ],
                capture_output=True,
                text=True,
            )
            if done.returncode:
                row = {"scheme": label, "error": done.stderr.strip().splitlines()[-1:]}
            else:
                row = {"scheme": label, **json.loads(done.stdout.strip().splitlines()[-1])}
                row["input_GB_per_s"] = doc["checkpoint_bytes"] / row["load_s"] / 1e9
            doc["rows"].append(row)
            Path(args.out).write_text(json.dumps(doc, indent=1))
            print(json.dumps({k: v for k, v in row.items() if k != "plan"}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
