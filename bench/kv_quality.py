"""What a quantized KV cache costs in accuracy on a real model: perplexity and greedy tokens.

    python3 bench/kv_quality.py MODEL --out FILE.json [--schemes fp8,...] [--tokens 256]
        [--prompt-tokens 32] [--greedy 32] [--device cpu] [--dtype bf16] [--dense] [--no-ppl] [--control]

- perplexity: a fixed English text (below), its first ``--prompt-tokens`` tokens prefilled, then
  every further token fed one at a time (teacher forcing), so each prediction attends the
  quantized cache through the decode path; the same walk with the unquantized cache is the
  baseline, and each scheme's change is reported relative to it;
- greedy: ``--greedy`` new tokens after each of three prompts, compared with the unquantized cache
  (the number of leading tokens that agree, and whether all do), and the unquantized model's
  top-1 minus top-2 logit at each of its steps (``baseline.greedy_margin``: near-ties named);
- decode speed of each run (tokens/s of the teacher-forced walk, this machine).

With quantrt's own layers, kernels that quantize their activations (GGUF's q8 activations on the
CPU, W8A8) turn any last-bit difference in attention into a different code somewhere, so greedy
agreement there measures that as much as the cache; ``--dense`` takes the weights dequantized by
transformers' GGUF loader, leaving the cache the only approximation.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

TEXT = (
    "The history of the printing press begins in the middle of the fifteenth century, when Johannes "
    "Gutenberg, a goldsmith from Mainz, combined movable metal type, oil-based ink and a wooden press "
    "adapted from those used to make wine. Before his invention, books in Europe were copied by hand, "
    "usually by monks in monasteries, and a single volume could take months to finish. The new method "
    "made it possible to produce hundreds of identical copies in the time a scribe needed for one. "
    "Within fifty years, printing shops had opened in more than two hundred cities, and millions of "
    "books were in circulation. Prices fell, literacy spread beyond the clergy and the nobility, and "
    "ideas travelled faster than ever before. Scholars could compare the same text in different places, "
    "which encouraged the growth of science, while pamphlets and broadsheets carried news and political "
    "arguments to a wide audience. Historians often describe the press as one of the most important "
    "inventions of the second millennium, because it changed not only how knowledge was stored but also "
    "who could take part in the conversations that shaped religion, government and learning."
)
PROMPTS = (
    "The capital of France is",
    "Here is a short poem about the sea:",
    "To compute the factorial of a number in Python, you can",
)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@torch.inference_mode()
def teacher_forced(
    model: Any, ids: list[int], prompt: int, scheme: str | None, protect: int | None = None
) -> tuple[float, float]:
    """Mean negative log-likelihood of ids[prompt:] with each token predicted through a decode step,
    and the decode tokens/s."""
    from transformers import DynamicCache

    from quantrt.kv import kv_cache
    from quantrt.models.generate import cache_kwarg

    device = next(model.parameters()).device
    cache = kv_cache(model, scheme, protect=protect) if scheme else None
    if cache is None:
        cache = DynamicCache(config=model.config)
    kw = cache_kwarg(model)
    x = torch.tensor([ids], device=device)
    logits = model(input_ids=x[:, :prompt], **{kw: cache}, use_cache=True).logits[0, -1].float()
    nll = -torch.log_softmax(logits, -1)[ids[prompt]].item()
    t0 = time.perf_counter()
    for i in range(prompt, len(ids) - 1):
        logits = model(input_ids=x[:, i : i + 1], **{kw: cache}, use_cache=True).logits[0, -1].float()
        nll -= torch.log_softmax(logits, -1)[ids[i + 1]].item()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dt = time.perf_counter() - t0
    return nll / (len(ids) - prompt), (len(ids) - 1 - prompt) / dt


@torch.inference_mode()
def margins(model: Any, prompt: list[int], new: list[int]) -> list[float]:
    """The unquantized model's top-1 minus top-2 logit at each greedy step (one forward over the
    prompt and its tokens): how far a step is from a tie, so a departure can be read against it."""
    device = next(model.parameters()).device
    x = torch.tensor([prompt + new[:-1]], device=device)
    logits = model(input_ids=x, use_cache=False).logits[0, len(prompt) - 1 :].float()
    top = logits.topk(2, dim=-1).values
    return (top[:, 0] - top[:, 1]).tolist()


def _num(v: float) -> float | None:
    """JSON has no NaN: a value not measured (``--no-ppl``) is null."""
    return None if math.isnan(v) else v


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="a checkpoint folder or .gguf quantrt loads")
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--schemes",
        default="fp8,fp8_e5m2,kv-int8,int8,kv-int8-g32,turboquant_k8v4,turboquant_4bit_nc,"
        "turboquant_k3v4_nc,turboquant_3bit_nc",
    )
    ap.add_argument("--tokens", type=int, default=256, help="tokens of the text scored")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--greedy", type=int, default=32, help="new tokens per greedy prompt")
    ap.add_argument("--no-ppl", action="store_true", help="greedy agreement only (no perplexity walk)")
    ap.add_argument(
        "--control",
        action="store_true",
        help="first a row 'control': quantrt's cache and attention path with every layer left "
        "unquantized, which separates the path's own differences from the quantization's",
    )
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument(
        "--dense",
        action="store_true",
        help="a .gguf loaded by transformers' own GGUF loader (weights dequantized, no quantized "
        "activations anywhere): the KV cache is then the only approximation",
    )
    args = ap.parse_args()

    import quantrt
    from quantrt.bench import git_sha
    from quantrt.models.generate import greedy
    from quantrt.models.tokenizer import load_tokenizer

    if args.dense:
        from transformers import AutoModelForCausalLM

        path = Path(args.model)
        model = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=DTYPES[args.dtype], attn_implementation="sdpa"
        ).to(args.device)
        model.eval()
    else:
        model = quantrt.from_pretrained(
            args.model, device=args.device, dtype=DTYPES[args.dtype], progress=False
        )
    tok = load_tokenizer(Path(args.model))
    ids = tok.encode(TEXT)[: args.tokens]
    prompts = [tok.encode(p) for p in PROMPTS]
    doc: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name()
        if args.device.startswith("cuda")
        else platform.processor() or "cpu",
        "model": str(args.model),
        "dtype": args.dtype,
        "weights": "transformers GGUF loader, dequantized" if args.dense else "quantrt",
        "tree": git_sha(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "text_tokens": len(ids),
        "prompt_tokens": args.prompt_tokens,
        "rows": [],
    }
    layers = int(getattr(getattr(model.config, "text_config", model.config), "num_hidden_layers", 0) or 1000)
    nan = (float("nan"), float("nan"))
    base_nll, base_tps = nan if args.no_ppl else teacher_forced(model, ids, args.prompt_tokens, None)
    base_greedy = [greedy(model, p, args.greedy, ignore_eos=True).new for p in prompts]
    gaps = [margins(model, p, g) for p, g in zip(prompts, base_greedy, strict=True)]
    doc["baseline"] = {
        "ppl": _num(math.exp(base_nll)),
        "decode_tokens_per_s": _num(base_tps),
        "prompts": list(PROMPTS),
        "greedy_margin": [[round(v, 4) for v in g] for g in gaps],
    }
    for i, g in enumerate(gaps):
        j = min(range(len(g)), key=g.__getitem__)
        print(f"prompt {i + 1}: smallest top-2 logit margin {g[j]:.3f} at new token {j}")
    print(f"{'scheme':<22} {'ppl':>9} {'change':>8} {'greedy agree':>14} {'tok/s':>7}")
    print(f"{'unquantized':<22} {math.exp(base_nll):9.3f} {'':>8} {'':>14} {base_tps:7.1f}")
    names = [s for s in args.schemes.split(",") if s]
    for name in (["control"] if args.control else []) + names:
        scheme, protect = ("kv-fp8", layers) if name == "control" else (name, None)
        nll, tps = nan if args.no_ppl else teacher_forced(model, ids, args.prompt_tokens, scheme, protect)
        agree = []
        for p, ref in zip(prompts, base_greedy, strict=True):
            got = greedy(model, p, args.greedy, ignore_eos=True, kv_cache=scheme, kv_protect=protect)
            same = next((i for i, (a, b) in enumerate(zip(got.new, ref, strict=True)) if a != b), len(ref))
            agree.append(same)
            kv = got.kv_cache
        row = {
            "scheme": name,
            "kv_cache": kv,
            "ppl": _num(math.exp(nll)),
            "ppl_change": _num(math.exp(nll) / math.exp(base_nll) - 1),
            "greedy_agree": agree,
            "greedy_identical": all(a == args.greedy for a in agree),
            "decode_tokens_per_s": _num(tps),
        }
        doc["rows"].append(row)
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
        print(
            f"{name if name == 'control' or not kv else kv['scheme']:<22} {math.exp(nll):9.3f} {math.exp(nll) / math.exp(base_nll) - 1:+8.2%} "
            f"{'/'.join(map(str, agree)):>14} {tps:7.1f}"
        )
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
