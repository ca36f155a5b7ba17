"""quantrt beside llama.cpp on the same GGUF files: one llama-shaped layer, per-token decode.

Writes a one-layer llama model (hidden 4096, ffn 14336, 32 query / 8 kv heads, vocabulary 256,
context 256) in F16 with gguf's writer, quantizes it with llama.cpp's own ``llama-quantize`` into
each type asked for, times llama.cpp's per-token decode with ``llama-bench`` (``-p 0 -n N``, the
threads asked for), and times quantrt's seven linears of the same file at M=1 (the dispatcher's
kernels, the same threads). The two sides alternate round by round (one ``llama-bench`` run, then
nine quantrt passes) and each reports its median over the rounds, so load from other work on a
shared machine hits both alike. llama.cpp's figure also holds its norms, rope, attention over a
short context and a 256-row output layer: a few percent.

llama.cpp is not a dependency: point ``--llama-bin`` at a build's ``bin`` folder (``cmake -B build
-DGGML_NATIVE=ON && cmake --build build --target llama-bench llama-quantize``; llama-cpp-python's
sdist vendors the sources). Usage:

    python bench/llama_cpp_layer.py --llama-bin ~/llama.cpp/build/bin --types Q4_0,Q8_0,Q4_K_M,Q6_K \
        --threads 2 --out bench/results/cpu-<date>-llama.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

H, F, NH, NKV, V, CTX = 4096, 14336, 32, 8, 256, 256
HEAD = H // NH
LINEARS = {  # gguf name -> (out, in)
    "attn_q": (H, H),
    "attn_k": (NKV * HEAD, H),
    "attn_v": (NKV * HEAD, H),
    "attn_output": (H, H),
    "ffn_gate": (F, H),
    "ffn_up": (F, H),
    "ffn_down": (H, F),
}


def write_f16(path: Path, seed: int = 0) -> None:
    """The source model: fixed-seed normal weights (x 0.02), F16 linears, F32 norms."""
    import gguf

    rng = np.random.default_rng(seed)

    def weight(out: int, inp: int) -> np.ndarray:
        return (rng.standard_normal((out, inp), dtype=np.float32) * 0.02).astype(np.float16)

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(CTX)
    w.add_embedding_length(H)
    w.add_feed_forward_length(F)
    w.add_head_count(NH)
    w.add_head_count_kv(NKV)
    w.add_rope_dimension_count(HEAD)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(V)
    w.add_tokenizer_model("none")
    w.add_tensor("token_embd.weight", weight(V, H))
    w.add_tensor("output_norm.weight", np.ones(H, np.float32))
    w.add_tensor("output.weight", weight(V, H))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(H, np.float32))
    w.add_tensor("blk.0.ffn_norm.weight", np.ones(H, np.float32))
    for name, (o, i) in LINEARS.items():
        w.add_tensor(f"blk.0.{name}.weight", weight(o, i))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def llama_decode_ms(bench: Path, model: Path, threads: int, tokens: int, reps: int) -> dict[str, float]:
    """llama-bench's decode (tg) speed as ms per token (its mean and spread over ``reps`` runs)."""
    cmd = [str(bench), "-m", str(model), "-p", "0", "-n", str(tokens), "-t", str(threads)]
    cmd += ["-r", str(reps), "-o", "json"]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    (run,) = json.loads(res.stdout)
    return {
        "ms_per_token": 1e3 / run["avg_ts"],
        "ms_stddev": 1e3 * run["stddev_ts"] / run["avg_ts"] ** 2,
        "build": f"{run.get('build_commit', '?')} ({run.get('build_number', '?')})",
        "cpu": run.get("cpu_info", ""),
    }


def seven_linears_ms(layers: list, reps: int) -> float:
    """Median over ``reps`` passes of one call of every (layer, x), after one warm-up pass."""
    import time

    for layer, x in layers:
        layer(x)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for layer, x in layers:
            layer(x)
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times))


def interleaved(llama: Callable[[], dict], ours: Callable[[], float], rounds: int) -> tuple[dict, list, list]:
    """Alternate one llama-bench run and one batch of quantrt passes ``rounds`` times, so a stretch
    of load from other work on the machine hits both sides alike (timing all of one side, then the
    other, let such a stretch decide the ratio: Q6_K read 0.95x one run and 1.2x the next)."""
    ll, qq, last = [], [], {}
    for _ in range(rounds):
        last = llama()
        ll.append(last["ms_per_token"])
        qq.append(ours())
    return last, ll, qq


def quantrt_dense_layers(model: Path, act_dtype: torch.dtype) -> tuple[list, dict[str, str]]:
    """The seven F16 linears of block 0, each with an M=1 input, as the dense layer a checkpoint's
    unquantized linears get on the CPU (``backends/cpu/dense_native.py``: the weight kept in fp16)."""

    import gguf

    from quantrt.backends.cpu.dense_native import make_dense_linear

    layers, kernels = [], {}
    for t in gguf.GGUFReader(model).tensors:
        name = t.name.removeprefix("blk.0.").removesuffix(".weight")
        if not t.name.startswith("blk.0.") or name not in LINEARS:
            continue
        w = torch.from_numpy(np.array(t.data)).view(torch.float16).reshape(LINEARS[name])
        layer = make_dense_linear(w, None, act_dtype)
        layers.append((layer, torch.randn(1, w.shape[1]).to(act_dtype)))
        kernels[name] = f"F16 -> {type(layer).__name__} {getattr(layer, 'strategy', lambda m: '')(1)}"
    if len(layers) != len(LINEARS):
        raise SystemExit(f"{model}: expected {len(LINEARS)} F16 linears in block 0, found {kernels}")
    return layers, kernels


def quantrt_linear_layers(model: Path, act_dtype: torch.dtype) -> tuple[list, dict[str, str]]:
    """The seven linears of block 0 through QuantLinear (the dispatcher's kernels), each with an
    M=1 input."""

    from quantrt.checkpoint import open_checkpoint
    from quantrt.layers import QuantLinear

    ck = open_checkpoint(model)
    layers, kernels = [], {}
    for prefix, qw in ck.weights():
        if ".layers.0." not in prefix or qw.entry.kind != "linear":
            continue
        layer = QuantLinear.from_canonical(qw.canonical(), device="cpu", act_dtype=act_dtype)
        layers.append((layer, torch.randn(1, qw.entry.K).to(act_dtype)))
        kernels[prefix] = f"{qw.scheme} -> {layer.kernel_name}"
    if len(layers) != len(LINEARS):
        raise SystemExit(f"{model}: expected {len(LINEARS)} quantized linears in block 0, found {kernels}")
    return layers, kernels


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-bin", required=True, help="folder with llama-bench and llama-quantize")
    ap.add_argument("--types", default="Q4_0,Q8_0,Q4_K_M,Q6_K")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32, help="llama-bench: tokens generated per run")
    ap.add_argument("--reps", type=int, default=7, help="rounds: one llama-bench run, then 9 quantrt passes")
    ap.add_argument("--act-dtype", default="fp32", choices=("fp32", "bf16"))
    ap.add_argument("--workdir", help="keep the GGUF files here (default: a temporary folder)")
    ap.add_argument("--out", help="write the results JSON here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    act = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.act_dtype]
    binp = Path(args.llama_bin)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="quantrt-llama-"))
    work.mkdir(parents=True, exist_ok=True)
    src = work / "layer-F16.gguf"
    if not src.exists():
        print(f"writing {src}", file=sys.stderr)
        write_f16(src)
    rows = []
    for t in args.types.split(","):
        dst = work / f"layer-{t}.gguf"
        if not dst.exists():  # F16 is the source file itself
            print(f"quantizing {t}", file=sys.stderr)
            subprocess.run(
                [str(binp / "llama-quantize"), str(src), str(dst), t, str(args.threads)],
                check=True,
                capture_output=True,
            )
        layers, kernels = (quantrt_dense_layers if t == "F16" else quantrt_linear_layers)(dst, act)
        llama, ll, qq = interleaved(
            lambda dst=dst: llama_decode_ms(binp / "llama-bench", dst, args.threads, args.tokens, 1),
            lambda layers=layers: seven_linears_ms(layers, 9),
            args.reps,
        )
        lm, qm = float(np.median(ll)), float(np.median(qq))
        row = {
            "type": t,
            "llama_cpp_ms_per_token": round(lm, 3),
            "llama_cpp_rounds_ms": [round(v, 3) for v in ll],
            "quantrt_seven_linears_ms": round(qm, 3),
            "quantrt_rounds_ms": [round(v, 3) for v in qq],
            "vs_llama_cpp": round(lm / qm, 3),
            "kernels": kernels,
            "llama_cpp_build": llama["build"],
        }
        rows.append(row)
        print(
            f"{t}: llama.cpp {row['llama_cpp_ms_per_token']} ms/token, quantrt {row['quantrt_seven_linears_ms']} ms"
            f" ({row['vs_llama_cpp']}x)",
            file=sys.stderr,
        )
    from quantrt.bench import git_sha, versions

    doc = {
        "date": datetime.date.today().isoformat(),
        "threads": args.threads,
        "act_dtype": args.act_dtype,
        "quantrt_cpu_isa": os.environ.get("QUANTRT_CPU_ISA", "native"),
        "model": {"hidden": H, "ffn": F, "heads": NH, "kv_heads": NKV, "vocab": V, "context": CTX},
        "git_sha": git_sha(),
        "versions": versions(),
        "llama_cpp": subprocess.run(
            [str(binp / "llama-bench"), "--version"], capture_output=True, text=True
        ).stdout.strip()
        or "unknown",
        "command": "python " + " ".join(sys.argv),
        "rows": rows,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    sys.exit(main())
