"""llama.cpp's per-token time of the MoE alone, beside quantrt's MoE call, on the same GGUF file.

``llama-bench`` times whole tokens. To take the MoE out of llama.cpp's token, this times it on two
files that differ only there, alternating round by round: the Mixtral-shaped layer of
``bench/cpu_moe.py`` (its Q4_K_M file) and a twin with the same attention, norms, embedding and
output in the same tensor types but a 32-wide dense FFN instead of the experts. llama.cpp's MoE
share is the difference of the two (the twin's 32-wide FFN and its missing router are negligible
against 229 MB of experts). quantrt's figure is its MoE call on the MoE file in the same rounds:
router logits, top-2 routing, ``QuantExperts`` (``bench/cpu_moe.py``'s ``QuantrtLayer.moe``).
Medians over the rounds; the per-round ratio's median too.

    OMP_NUM_THREADS=2 python bench/cpu_moe_share.py --llama-bin <llama.cpp>/build/bin \\
        --model .llama/models/moe-Q4_K_M.gguf --threads 2 --rounds 11 \\
        --out bench/results/cpu-<date>-moe-share.json
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
TWIN_FF = 32


def _cpu_moe() -> Any:
    spec = importlib.util.spec_from_file_location("cpu_moe", HERE / "cpu_moe.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def write_twin(cm: Any, path: Path, seed: int = 0) -> None:
    """The MoE file's layer with a 32-wide dense FFN instead of the experts, in F16."""
    import gguf

    rng = np.random.default_rng(seed)

    def weight(out: int, inp: int) -> np.ndarray:
        return (rng.standard_normal((out, inp), dtype=np.float32) * 0.02).astype(np.float16)

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(cm.CTX)
    w.add_embedding_length(cm.H)
    w.add_feed_forward_length(TWIN_FF)
    w.add_head_count(cm.NH)
    w.add_head_count_kv(cm.NKV)
    w.add_rope_dimension_count(cm.HEAD)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(cm.V)
    w.add_tokenizer_model("none")
    w.add_tensor("token_embd.weight", weight(cm.V, cm.H))
    w.add_tensor("output_norm.weight", np.ones(cm.H, np.float32))
    w.add_tensor("output.weight", weight(cm.V, cm.H))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(cm.H, np.float32))
    w.add_tensor("blk.0.ffn_norm.weight", np.ones(cm.H, np.float32))
    for name, (_, o, i) in cm.ATTENTION.items():
        w.add_tensor(f"blk.0.{name}.weight", weight(o, i))
    w.add_tensor("blk.0.ffn_gate.weight", weight(TWIN_FF, cm.H))
    w.add_tensor("blk.0.ffn_up.weight", weight(TWIN_FF, cm.H))
    w.add_tensor("blk.0.ffn_down.weight", weight(cm.H, TWIN_FF))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-bin", required=True, help="folder with llama-bench and llama-quantize")
    ap.add_argument("--model", required=True, help="bench/cpu_moe.py's quantized MoE file")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--passes", type=int, default=9, help="quantrt MoE calls per round (median)")
    ap.add_argument("--out", help="write the results JSON here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cm = _cpu_moe()
    model = Path(args.model)
    bin_ = Path(args.llama_bin)
    types = cm.tensor_types(model)
    twin = model.with_name(model.stem + "-twin.gguf")
    if not twin.exists():
        f16 = model.with_name(model.stem + "-twin-F16.gguf")
        write_twin(cm, f16)
        forced = [
            a
            for name in cm.ATTENTION
            for a in ("--tensor-type", f"{name}={types[f'blk.0.{name}.weight'].lower()}")
        ]
        cmd = [str(bin_ / "llama-quantize"), *forced]
        cmd += ["--output-tensor-type", types["output.weight"].lower()]
        cmd += ["--token-embedding-type", types["token_embd.weight"].lower()]
        cmd += [str(f16), str(twin), "Q4_K_M", "2"]
        subprocess.run(cmd, check=True, capture_output=True)
        f16.unlink()
    twin_types = cm.tensor_types(twin)
    same = {n: (types[n], twin_types.get(n)) for n in types if "exps" not in n and "gate_inp" not in n}
    differ = {n: t for n, t in same.items() if t[0] != t[1]}
    if differ:
        print(f"the twin's tensor types differ: {differ}", file=sys.stderr)
        return 1
    layer = cm.QuantrtLayer(model, torch.bfloat16)
    rounds: list[dict[str, float]] = []
    for r in range(args.rounds):
        moe_file = cm.llama_decode_ms(bin_ / "llama-bench", model, args.threads, args.tokens, 1)[
            "ms_per_token"
        ]
        twin_file = cm.llama_decode_ms(bin_ / "llama-bench", twin, args.threads, args.tokens, 1)[
            "ms_per_token"
        ]
        q = cm.median_ms(layer.moe, args.passes)
        row = {
            "llama_cpp_moe_file_ms": round(moe_file, 4),
            "llama_cpp_twin_ms": round(twin_file, 4),
            "llama_cpp_moe_share_ms": round(moe_file - twin_file, 4),
            "quantrt_moe_ms": round(q, 4),
        }
        row["ratio"] = round(row["llama_cpp_moe_share_ms"] / q, 4)
        rounds.append(row)
        print(f"round {r}: {row}", flush=True)
    med = {k: round(float(np.median([x[k] for x in rounds])), 4) for k in rounds[0] if k != "ratio"}
    doc = {
        "date": datetime.date.today().isoformat(),
        "cpu": cm.cpu_model(),
        "threads": args.threads,
        "command": " ".join(sys.argv),
        "model": str(model),
        "twin": str(twin),
        "tensor_types": types,
        "twin_tensor_types": twin_types,
        "quantrt_experts": layer.schemes,
        "rounds": rounds,
        "medians_ms": med,
        "llama_cpp_moe_share_over_quantrt_moe": round(
            med["llama_cpp_moe_share_ms"] / med["quantrt_moe_ms"], 4
        ),
        "paired_ratio_median": round(float(np.median([x["ratio"] for x in rounds])), 4),
    }
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(
        json.dumps(
            {k: doc[k] for k in ("medians_ms", "llama_cpp_moe_share_over_quantrt_moe", "paired_ratio_median")}
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
