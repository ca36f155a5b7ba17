"""quantrt's int4 kernels beside vLLM's Marlin and Machete, tinygemm, gemlite, bitsandbytes, cuBLAS bf16.

    python3 bench/gpu_peers.py --out FILE.json [--schemes w4a16-int-g128-sym,w4a16-nf4-g64]
        [--shapes 8192x57344,...] [--ms 1,16,64,256,4096]

One random weight per scheme and shape (``quantrt.bench.random_weight``), the same bf16 x for
every kernel. The peers timed depend on the scheme: int4 with groups of 128 gets Marlin (as built
by ``ci/build-peers.sh``: symmetric only), Machete (as built by ``ci/build-peers-machete.sh``:
symmetric only, Hopper only; the row's ``machete_schedule`` is vLLM's heuristic pick), tinygemm
and gemlite (``GemLiteLinear``, asymmetric or symmetric); bitsandbytes NF4 (``w4a16-nf4-g64``)
gets ``bnb.matmul_4bit`` on the same packed weight and absmax. gemlite and bitsandbytes are the wheels in ``.peers/wheels`` (see
``bench/peers.py``). Each cell checks every kernel's output against the fp32
dequantize-then-matmul reference first (max error over max |ref|), then times each (medians, L2
flushed, ``quantrt.bench.median_us``), eager and under CUDA-graph replay; ratios are cuBLAS bf16's
time over the kernel's. The JSON is rewritten after every cell. A missing peer (no library or
package, a shape or scheme it refuses) is recorded in the row's ``missing`` with the reason and
the rest timed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

SCHEME = "w4a16-int-g128-sym"
SHAPES = "8192x57344,28672x8192,4096x28672,4096x4096"  # K x N, the four
MS = "1,16,64,256,4096"


def max_rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float() - ref).abs().max() / ref.abs().max())


# The peers that take each scheme family; quantrt and cuBLAS bf16 run on every row.
PEERS = {"int": ("marlin", "machete", "tinygemm", "gemlite"), "bnb4": ("bnb_nf4",)}


def peer(name: str, canon: Any) -> tuple[Any, str]:
    """One peer's ``x -> y`` on this weight, or None and why not."""
    import peers

    from quantrt.bench import tinygemm_baseline

    make = {
        "marlin": peers.marlin_baseline,
        "machete": peers.machete_baseline,
        "tinygemm": tinygemm_baseline,
        "gemlite": peers.gemlite_baseline,
        "bnb_nf4": peers.bnb_nf4_baseline,
    }[name]
    try:
        fn = make(canon)
    except Exception as e:  # a peer that breaks while packing the weight: recorded, the rest timed
        return None, f"{type(e).__name__}: {str(e)[:200]}"
    if fn is None:
        return None, "cuda.torch_tinygemm is not registered here" if name == "tinygemm" else peers.last_reason
    return fn, ""


def kernels(canon: Any, dense: torch.Tensor) -> tuple[dict[str, Any], dict[str, str]]:
    """Name -> callable x -> y for every kernel that takes this weight; name -> why not, for the rest."""
    from quantrt.layers import QuantLinear

    layer = QuantLinear.from_canonical(canon, device="cuda", act_dtype=torch.bfloat16)
    out: dict[str, Any] = {"quantrt": layer, "cublas_bf16": lambda x: F.linear(x, dense)}
    missing: dict[str, str] = {}
    for name in PEERS.get(canon.scheme.family, ()):
        fn, why = peer(name, canon)
        if fn is None:
            missing[name] = why
        else:
            out[name] = fn
    return out, missing


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--schemes", default=SCHEME, help="comma-separated quantrt schemes")
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--ms", default=MS)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench/gpu_peers.py needs a CUDA GPU", file=sys.stderr)
        return 2
    sys.path.insert(0, str(Path(__file__).resolve().parent))

    import peers

    from quantrt.bench import graph_replay_us, median_us, random_weight, run_header
    from quantrt.reference import dequantize

    schemes = args.schemes.split(",")
    what = (
        "int4 g128 sym: quantrt vs Marlin, Machete, tinygemm, gemlite, cuBLAS bf16"
        if schemes == [SCHEME]
        else f"{args.schemes}: quantrt vs Marlin, Machete, tinygemm, gemlite (int4), bitsandbytes (NF4), cuBLAS bf16"
    )
    doc = {**run_header(what, "bench/gpu_peers.py", args), "scheme": args.schemes, "rows": []}
    for scheme in schemes:
        for shape in args.shapes.split(","):
            K, N = map(int, shape.split("x"))
            torch.manual_seed(K + N)
            canon = random_weight(scheme, N, K, device="cuda")
            w = dequantize(canon).float()
            dense = w.to(torch.bfloat16)
            fns, missing = kernels(canon, dense)
            for M in map(int, args.ms.split(",")):
                x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
                ref = x.float() @ w.t()
                row: dict[str, Any] = {
                    "scheme": scheme,
                    "K": K,
                    "N": N,
                    "M": M,
                    "missing": missing,
                    "err": {},
                    "us": {},
                    "graph_us": {},
                }
                row["quantrt_path"] = fns["quantrt"]._kernel.strategy(fns["quantrt"]._state, M)
                if "machete" in fns:
                    row["machete_schedule"] = peers.machete_schedule(M, N, K)
                for name, fn in fns.items():
                    try:
                        row["err"][name] = round(max_rel(fn(x), ref), 5)
                        row["us"][name] = round(median_us(lambda fn=fn, x=x: fn(x)), 2)
                        g, why = graph_replay_us(lambda fn=fn, x=x: fn(x))
                        row["graph_us"][name] = round(g, 2) if g is not None else why
                    except Exception as e:  # a peer that fails on this shape: recorded, the rest timed
                        row["err"][name] = f"{type(e).__name__}: {str(e)[:160]}"
                base = row["us"].get("cublas_bf16")
                row["vs_cublas"] = {k: round(base / v, 3) for k, v in row["us"].items() if base and v}
                doc["rows"].append(row)
                Path(args.out).write_text(json.dumps(doc, indent=1))
                ratio = "  ".join(f"{k} {v:.2f}x" for k, v in row["vs_cublas"].items() if k != "cublas_bf16")
                times = "  ".join(f"{k} {v:.1f}" for k, v in row["us"].items())
                where = f"{scheme} " if len(schemes) > 1 else ""
                print(
                    f"{where}{K}x{N} M={M}: {times} us | vs cuBLAS: {ratio} | {row['quantrt_path']}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
