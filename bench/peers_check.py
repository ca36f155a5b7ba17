"""Device check of the vLLM Marlin baseline (``bench/peers.py``) against quantrt's reference.

    python3 bench/peers_check.py [--time]

For K x N in 4096 x 4096 and 4096 x 28672 and M in 1, 16, 256: a random w4a16-int-g128-sym weight
(``quantrt.bench.random_weight``), Marlin's output set against the fp32 dequantize-then-matmul
reference (``quantrt.reference.linear``). The error is max |y - ref| / max |ref|; ``bf16s`` is the
same against a reference whose scales are rounded to bf16 as Marlin keeps them (the kernel's own
error). ``--time`` adds Marlin's median in microseconds (L2 flushed). Exit 0 when every case is
within 2e-2, 1 when one is not, 2 when the check cannot run (no CUDA, no peer library).
"""

from __future__ import annotations

import argparse
import sys

import torch

SHAPES = ((4096, 4096), (4096, 28672))  # (K, N)
MS = (1, 16, 256)
SCHEME = "w4a16-int-g128-sym"
TOL = 2e-2


def max_rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest error relative to the largest reference value: a per-element ratio would blow up
    on outputs near zero."""
    return float((y.float() - ref).abs().max() / ref.abs().max())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--time", action="store_true", help="also time Marlin per case")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("peers_check: no CUDA device here; run it on the GPU machine", file=sys.stderr)
        return 2

    import peers  # bench/ is on sys.path when a script here runs

    from quantrt.bench import median_us, random_weight
    from quantrt.canonical import CanonicalWeight
    from quantrt.reference import linear

    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, library {peers.peers_dir()}")
    failed = 0
    for K, N in SHAPES:
        torch.manual_seed(K + N)
        canon = random_weight(SCHEME, N, K, device="cuda")
        mm = peers.marlin_baseline(canon)
        if mm is None:
            print(f"peers_check: Marlin baseline unavailable: {peers.last_reason}", file=sys.stderr)
            return 2
        bf16s = CanonicalWeight(
            canon.scheme,
            N,
            K,
            {**canon.tensors, "scales": canon["scales"].to(torch.bfloat16).float()},
            canon.output_sizes,
        )
        for M in MS:
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            y = mm(x)
            torch.cuda.synchronize()
            err = max_rel(y, linear(x, canon, out_dtype=torch.float32, weight_only=True))
            err_k = max_rel(y, linear(x, bf16s, out_dtype=torch.float32, weight_only=True))
            ok = err <= TOL and bool(torch.isfinite(y).all())
            failed += not ok
            line = (
                f"K={K:5d} N={N:5d} M={M:4d}  max_rel {err:.3e}  bf16s {err_k:.3e}  {'ok' if ok else 'FAIL'}"
            )
            if args.time:
                line += f"  marlin {median_us(lambda mm=mm, x=x: mm(x)):.1f} us"
            print(line, flush=True)
    print(
        f"peers_check: {failed} case(s) above {TOL}" if failed else "peers_check: all cases within tolerance"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
