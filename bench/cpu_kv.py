"""Times decode attention over the paged KV cache on this CPU: the native kernels
(``backends/cpu/kv_native.py``) against quantrt's torch path (``TorchKV``) on the same cache, and
``scaled_dot_product_attention`` on a contiguous bf16 cache (the dense baseline), Llama-3-8B heads.

Every method of one cell runs in the same process, interleaved repeat by repeat (``cpu_timing``);
the table shows medians in ms per call of one layer's decode attention and the ratios to SDPA-bf16
(below 1 is faster than SDPA) and torch path / native (the native speed-up).

    python bench/cpu_kv.py [--threads 2] [--repeats 7] [--contexts 1024,4096,16384] [--batches 1,4]
                           [--out cpu_kv.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys

import torch
import torch.nn.functional as F
from cpu_timing import median_ms  # bench/ is on sys.path when a script here runs

from quantrt.backends.cpu.kv_native import NativeKV
from quantrt.kv import KVPages
from quantrt.kv.kernels import TorchKV
from quantrt.schemes import parse_kv_scheme

#: Llama-3-8B attention: query heads, KV heads, head_dim
HQ, H, D = 32, 8, 128
BLOCK = 16
#: cache label -> scheme name (None: unquantized bf16)
CACHES = {
    "bf16": None,
    "fp8 (tensor)": "kv-fp8",
    "int8 (token)": "kv-int8-token",
    "tq 4bit_nc": "kv-tq-4bit-nc",
    "tq k8v4": "kv-tq-k8v4",
}


def cpu_name() -> str:
    """The CPU's brand string (py-cpuinfo when installed, else the platform's)."""
    try:
        import cpuinfo

        return str(cpuinfo.get_cpu_info().get("brand_raw", ""))
    except Exception:  # py-cpuinfo is optional
        return platform.processor() or platform.machine()


def build_cache(
    scheme: str | None, B: int, L: int, k: torch.Tensor, v: torch.Tensor
) -> tuple[KVPages, torch.Tensor]:
    """One layer's pages holding B sequences of L tokens (each sequence's blocks consecutive, as the
    model cache lays them out), written by the native kernels, and its block table."""
    per = -(-L // BLOCK)
    pages = KVPages(None if scheme is None else parse_kv_scheme(scheme), B * per, BLOCK, H, D)
    table = torch.arange(B * per, dtype=torch.int32).view(B, per)
    pos = torch.arange(L)
    slots = (table.long()[:, pos // BLOCK] * BLOCK + pos % BLOCK).flatten()
    kt = k.transpose(1, 2).reshape(-1, H, D)
    vt = v.transpose(1, 2).reshape(-1, H, D)
    if pages.static:
        pages.calibrate(kt, vt)
    NativeKV().write(pages, kt, vt, slots)
    return pages, table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--contexts", default="1024,4096,16384")
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--out", help="write the rows and the machine here (JSON)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)  # the native kernels take torch's thread count
    torch.manual_seed(0)
    native, torch_kv = NativeKV(), TorchKV()
    rows = []
    head = f"{'context':>7} {'B':>2} {'cache':<13} {'native':>9} {'torch':>9} {'sdpa-bf16':>9} "
    head += f"{'nat/sdpa':>8} {'tor/sdpa':>8} {'tor/nat':>7}"
    print(f"decode attention, one layer, Hq={HQ} H={H} D={D}, {args.threads} threads; ms (median)")
    print(head)
    for L in (int(x) for x in args.contexts.split(",")):
        for B in (int(x) for x in args.batches.split(",")):
            k = torch.randn(B, H, L, D).to(torch.bfloat16)
            v = torch.randn(B, H, L, D).to(torch.bfloat16)
            q = torch.randn(B, HQ, D).to(torch.bfloat16)
            lens = torch.full((B,), L, dtype=torch.int32)
            q4 = q[:, :, None]
            sdpa = {"sdpa": lambda q4=q4, k=k, v=v: F.scaled_dot_product_attention(q4, k, v, enable_gqa=True)}
            for label, scheme in CACHES.items():
                pages, table = build_cache(scheme, B, L, k, v)
                fns = {
                    "native": lambda p=pages, t=table, q=q, n=lens, L=L: native.decode(
                        q, p, t, n, L, scale=D**-0.5
                    ),
                    "torch": lambda p=pages, t=table, q=q, n=lens, L=L: torch_kv.decode(
                        q, p, t, n, L, scale=D**-0.5
                    ),
                    **sdpa,
                }
                ms = median_ms(fns, args.repeats)
                row = {
                    "context": L, "batch": B, "cache": label, "scheme": scheme or "bf16",
                    "native_ms": ms["native"], "torch_ms": ms["torch"], "sdpa_bf16_ms": ms["sdpa"],
                    "native_over_sdpa": ms["native"] / ms["sdpa"], "torch_over_sdpa": ms["torch"] / ms["sdpa"],
                    "torch_over_native": ms["torch"] / ms["native"],
                }  # fmt: skip
                rows.append(row)
                print(
                    f"{L:>7} {B:>2} {label:<13} {ms['native']:>9.3f} {ms['torch']:>9.3f} {ms['sdpa']:>9.3f} "
                    f"{row['native_over_sdpa']:>8.2f} {row['torch_over_sdpa']:>8.2f} {row['torch_over_native']:>7.2f}",
                    flush=True,
                )
                del pages
    if args.out:
        info = {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join([sys.executable, *sys.argv]),
            "device": {"cpu": cpu_name(), "platform": platform.platform(), "threads": args.threads},
            "torch": torch.__version__,
            "shape": {"q_heads": HQ, "kv_heads": H, "head_dim": D, "block_size": BLOCK},
            "repeats": args.repeats,
            "rows": rows,
        }
        with open(args.out, "w") as f:
            json.dump(info, f, indent=1)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
