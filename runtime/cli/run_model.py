"""``quantrt run PATH``: load a checkpoint as a model, generate, and say how it went.

Prints the generated text, the load time, peak memory, prefill and decode tokens/s and the
per-layer plan (kernel -> layers). ``--check`` also runs the prompt through the same model with
every quantized layer on the fp32 reference (dequantize, then matmul in fp32) and compares the
logits; it fails when they differ by more than the dtype's tolerance.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path
from typing import Any

import torch

from ..env import Overrides
from ..errors import ConfigError

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
#: relative Frobenius error of the prompt's logits against the fp32 reference that passes --check
CHECK_TOLERANCE = {torch.float32: 2e-2, torch.bfloat16: 6e-2, torch.float16: 4e-2}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``quantrt run PATH`` (``run`` without a PATH keeps its own)."""
    g = p.add_argument_group("with a PATH (a checkpoint folder or a .gguf file)")
    g.add_argument("--prompt", help="text to continue (needs the checkpoint's tokenizer)")
    g.add_argument("--prompt-ids", help="comma-separated token ids, instead of --prompt")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the tokenizer's chat template")
    g.add_argument("--max-new-tokens", type=int, default=32, help="tokens to generate (default 32)")
    g.add_argument("--ignore-eos", action="store_true", help="generate all tokens even past end-of-sequence")
    g.add_argument("--dtype", choices=sorted(DTYPES), help="activation dtype (default: the checkpoint's)")
    g.add_argument("--cuda-graphs", action="store_true", help="decode with a static cache and CUDA graphs")
    g.add_argument(
        "--kv-cache",
        default="auto",
        metavar="SCHEME",
        help="KV cache: auto (the checkpoint's KV scales if it stores them, else unquantized), none, "
        "paged (unquantized pages, quantrt's attention), fp8, fp8_e5m2, int8, a kv-* scheme or a "
        "turboquant_* preset (default auto)",
    )
    g.add_argument(
        "--quantize",
        metavar="SCHEME",
        help="quantize a dense checkpoint's linear layers at load to a catalog scheme (round to nearest; "
        "the output head and MoE routers stay dense)",
    )
    g.add_argument(
        "--quantize-search",
        choices=["mse"],
        help="with --quantize: integer schemes pick each group's range by least squared error",
    )
    g.add_argument("--check", action="store_true", help="compare the prompt's logits with the fp32 reference")
    g.add_argument("--quiet", action="store_true", help="no progress bar")


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    return 0  # pragma: no cover


def _rss() -> int:
    """Resident memory now; on Linux also restarts the peak count (VmHWM), so that the peak read
    after loading is the load's own and not that of earlier work (the tokenizer's conversion)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    return _status("VmRSS:")


def _peak() -> int:
    return _status("VmHWM:") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _prompt(args: argparse.Namespace, path: Path) -> tuple[list[int], Any]:
    if args.prompt_ids:
        try:
            ids = [int(t) for t in args.prompt_ids.split(",") if t.strip()]
        except ValueError:
            raise ConfigError(
                f"--prompt-ids {args.prompt_ids!r}: expected comma-separated integers"
            ) from None
        return ids, None
    if args.prompt is None:
        raise ConfigError("quantrt run PATH needs --prompt TEXT (or --prompt-ids 1,2,3)")
    from ..models.tokenizer import load_tokenizer

    tok = load_tokenizer(path)
    if args.chat:
        ids = tok.apply_chat_template([{"role": "user", "content": args.prompt}], add_generation_prompt=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return list(ids), tok
    return tok(args.prompt)["input_ids"], tok


def _check(
    path: Path, model: Any, ids: list[int], device: torch.device, quantize: Any = None
) -> dict[str, Any]:
    """The prompt's logits beside the same model with every quantized layer on the reference."""
    from ..models import from_pretrained

    ov = Overrides.from_env()
    ref_ov = Overrides("reference", None, {}, ov.disabled, None, "allow")
    ref = from_pretrained(
        path, device=device, dtype=torch.float32, overrides=ref_ov, progress=False, quantize=quantize
    )
    x = torch.tensor([ids], device=device)
    with torch.inference_mode():
        got = model(input_ids=x).logits.double()
        want = ref(input_ids=x).logits.double()
    err = float((got - want).norm() / want.norm())
    top1 = float((got.argmax(-1) == want.argmax(-1)).double().mean())
    dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
    return {
        "rel_err": err,
        "top1_agreement": top1,
        "tolerance": CHECK_TOLERANCE[dtype],
        "ok": err <= CHECK_TOLERANCE[dtype],
    }


def handle(args: argparse.Namespace) -> int:
    """Run a checkpoint (see the module docstring)."""
    from ..models import from_pretrained
    from ..models.generate import greedy
    from . import emit

    path = Path(args.path)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.cuda_graphs and device.type != "cuda":
        raise ConfigError(f"--cuda-graphs needs a CUDA device; this run is on {device}")
    if args.kv_cache.strip().lower() not in ("auto", "none", "paged", "bf16", "bfloat16", "fp16", "float16"):
        from ..schemes import kv_scheme_from_name

        kv_scheme_from_name(args.kv_cache)  # a bad name fails before the model loads
    ids, tok = _prompt(args, path)
    if not ids:
        raise ConfigError("the prompt has no tokens")
    _import_code(path)

    base = _rss()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    quantize: Any = args.quantize
    if args.quantize_search:
        if not args.quantize:
            raise ConfigError("--quantize-search needs --quantize SCHEME")
        from ..formats.online import OnlineQuantization

        quantize = OnlineQuantization(args.quantize, search=args.quantize_search)
    t0 = time.perf_counter()
    model = from_pretrained(
        path,
        device=device,
        dtype=DTYPES[args.dtype] if args.dtype else None,
        progress=False if args.quiet else None,
        quantize=quantize,
    )
    load_s = time.perf_counter() - t0
    host_peak = max(0, _peak() - base)
    gen = greedy(
        model,
        ids,
        args.max_new_tokens,
        ignore_eos=args.ignore_eos,
        cuda_graphs=args.cuda_graphs,
        kv_cache=args.kv_cache,
    )
    text = tok.decode(gen.new, skip_special_tokens=True) if tok is not None else None
    report = model.quantrt
    size = sum(f.path.stat().st_size for f in _files(path))
    out: dict[str, Any] = {
        "path": str(path),
        "format": report.format,
        "model_type": model.config.model_type,
        "device": str(device),
        "dtype": report.dtype,
        "load_seconds": round(load_s, 3),
        "quantized_at_load": args.quantize,
        "checkpoint_bytes": size,
        "peak_host_bytes": host_peak,
        "peak_gpu_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
        "plan": report.plan_summary(),
        "ignored_tensors": report.ignored,
        **gen.to_json(),
        "text": text,
    }
    status = 0
    if args.check:
        out["check"] = _check(path, model, ids, device, quantize)
        status = 0 if out["check"]["ok"] else 1
    if args.json:
        emit(out)
    else:
        _print(out)
    return status


def _import_code(path: Path) -> None:
    """Import transformers and the architecture's model class before the memory baseline: the
    peak reported is what the model's data costs, not what importing code does."""
    from transformers import AutoModelForCausalLM

    from ..checkpoint import open_checkpoint
    from ..models.config import model_config

    config = model_config(open_checkpoint(path))
    try:
        AutoModelForCausalLM._model_mapping[type(config)]
    except (KeyError, AttributeError):
        pass  # from_pretrained says which architectures it cannot build


def _files(path: Path) -> list[Any]:
    from ..checkpoint import open_checkpoint

    return open_checkpoint(path).index.files


def _print(o: dict[str, Any]) -> None:
    mb = 1 << 20
    print(f"model   {o['path']} ({o['format']}, {o['model_type']}) on {o['device']}, {o['dtype']}")
    mem = f"peak host memory +{o['peak_host_bytes'] / mb:.0f} MiB"
    if o["peak_gpu_bytes"] is not None:
        mem += f", GPU {o['peak_gpu_bytes'] / mb:.0f} MiB"
    print(f"load    {o['load_seconds']:.2f} s, {mem} (checkpoint {o['checkpoint_bytes'] / mb:.0f} MiB)")
    print("plan    " + ", ".join(f"{k} x{v}" for k, v in o["plan"].items()))
    graphs = ", CUDA graphs" if o["cuda_graphs"] else ""
    print(
        f"speed   prefill {o['prompt_tokens']} tokens at {o['prefill_tokens_per_s']:.1f} tok/s; "
        f"decode {o['new_tokens']} tokens at {o['decode_tokens_per_s']:.1f} tok/s{graphs}"
    )
    if o.get("kv_cache"):
        kv = o["kv_cache"]
        layers = ", ".join(f"{k} x{v}" for k, v in kv["layers"].items())
        print(f"kv      {kv['scheme']} ({layers}) on {kv['kernels']} kernels, {kv['bytes'] / mb:.1f} MiB")
    if "check" in o:
        c = o["check"]
        verdict = "ok" if c["ok"] else "FAIL"
        print(
            f"check   logits vs the fp32 reference: rel err {c['rel_err']:.2e} (tolerance {c['tolerance']:.0e}), "
            f"top-1 agreement {c['top1_agreement']:.0%}: {verdict}"
        )
    if o["text"] is not None:
        print("text    " + o["text"].replace("\n", "\n        "))
    else:
        print(f"tokens  {o['token_ids']}")
    sys.stdout.flush()
