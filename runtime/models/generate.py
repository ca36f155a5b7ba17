"""Greedy generation with the prefill and the decode timed apart.

The loop is the plain one (``argmax`` of the last position, fed back), so its tokens equal
``model.generate(do_sample=False)``'s; it exists to time prefill and decode separately and to
run decode as one CUDA graph per token when asked: a static cache, one captured step reading
the token and its position from fixed buffers, replayed per token. Decode of a small model is
bound by host cost in eager mode (tens of kernel launches per layer); a replay is one launch.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Generation:
    """Token ids (prompt then new ones) and how long prefill and decode took."""

    prompt: list[int]
    new: list[int] = field(default_factory=list)
    prefill_s: float = 0.0
    decode_s: float = 0.0
    cuda_graphs: bool = False
    #: the quantized KV cache it ran with (scheme, layers, kernels, bytes), None for the model's own
    kv_cache: dict[str, Any] | None = None

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.new

    @property
    def prefill_tps(self) -> float:
        return len(self.prompt) / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tps(self) -> float:
        """Tokens per second over the decode steps (the first new token comes from the prefill)."""
        steps = len(self.new) - 1
        return steps / self.decode_s if steps > 0 and self.decode_s else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "prompt_tokens": len(self.prompt),
            "new_tokens": len(self.new),
            "prefill_seconds": round(self.prefill_s, 4),
            "decode_seconds": round(self.decode_s, 4),
            "prefill_tokens_per_s": round(self.prefill_tps, 2),
            "decode_tokens_per_s": round(self.decode_tps, 2),
            "cuda_graphs": self.cuda_graphs,
            "kv_cache": self.kv_cache,
            "token_ids": self.tokens,
        }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cache_kwarg(model: Any) -> str:
    """transformers 5.25 renamed ``past_key_values`` to ``cache`` (the old name is deprecated)."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _stop_ids(model: Any, eos: int | Sequence[int] | None) -> set[int]:
    if eos is None:
        eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        return set()
    return {int(eos)} if isinstance(eos, int) else {int(e) for e in eos}


@torch.inference_mode()
def greedy(
    model: Any,
    prompt: Sequence[int],
    max_new_tokens: int,
    *,
    eos_token_id: int | Sequence[int] | None = None,
    ignore_eos: bool = False,
    cuda_graphs: bool = False,
    kv_cache: Any = None,
    kv_protect: int | None = None,
) -> Generation:
    """Greedy decoding of ``max_new_tokens`` after ``prompt`` (stopping at an end-of-sequence token
    unless ``ignore_eos``). ``cuda_graphs``: a static cache and one CUDA graph per decode step.
    ``kv_cache``: a quantized KV cache scheme (``"fp8"``, ``"auto"``, a :class:`KVScheme`; see
    :func:`quantrt.kv.kv_cache`), None for transformers' own cache; ``kv_protect``: layers at each
    end the quantized cache leaves unquantized (its ``protect``)."""
    from transformers import DynamicCache, StaticCache

    if not prompt:
        raise ValueError("greedy: the prompt holds no tokens")
    device = next((b.device for b in model.buffers()), torch.device("cpu"))
    if cuda_graphs and device.type != "cuda":
        raise ValueError(f"greedy: CUDA graphs need the model on a CUDA device, it is on {device}")
    stop = set() if ignore_eos else _stop_ids(model, eos_token_id)
    ids = torch.tensor([list(prompt)], dtype=torch.long, device=device)
    out = Generation(list(prompt), cuda_graphs=cuda_graphs)
    if max_new_tokens <= 0:
        return out
    total = len(prompt) + max_new_tokens
    cache: Any = None
    if kv_cache is not None:
        from ..kv import kv_cache as make_kv_cache

        cache = make_kv_cache(
            model, kv_cache, max_cache_len=total if cuda_graphs else None, protect=kv_protect
        )
        out.kv_cache = cache.describe() if cache is not None else None
    if cache is None and cuda_graphs:
        cache = StaticCache(config=model.config, max_cache_len=total)
    elif cache is None:
        cache = DynamicCache(config=model.config)
    _sync(device)
    t0 = time.perf_counter()
    pos = torch.arange(len(prompt), device=device)
    kw = cache_kwarg(model)
    logits = model(input_ids=ids, **{kw: cache}, cache_position=pos, use_cache=True, logits_to_keep=1).logits
    nxt = int(logits[0, -1].argmax())
    _sync(device)
    out.prefill_s = time.perf_counter() - t0
    out.new.append(nxt)
    if nxt in stop or max_new_tokens == 1:
        return out
    step = _GraphStep(model, cache, device, len(prompt)) if cuda_graphs else None
    t0 = time.perf_counter()
    for i in range(1, max_new_tokens):
        p = len(prompt) + i - 1
        if step is not None:
            nxt = step(nxt, p)
        else:
            tok = torch.tensor([[nxt]], dtype=torch.long, device=device)
            cp = torch.tensor([p], device=device)
            logits = model(input_ids=tok, **{kw: cache}, cache_position=cp, use_cache=True).logits
            nxt = int(logits[0, -1].argmax())
        out.new.append(nxt)
        if nxt in stop:
            break
    _sync(device)
    out.decode_s = time.perf_counter() - t0
    if out.kv_cache is not None:
        out.kv_cache = cache.describe()
    return out


class _GraphStep:
    """One decode step captured as a CUDA graph over a static cache: token and position are read
    from fixed buffers, the next token's id written to one."""

    def __init__(self, model: Any, cache: Any, device: torch.device, first_pos: int) -> None:
        self.tok = torch.zeros(1, 1, dtype=torch.long, device=device)
        self.pos = torch.full((1,), first_pos, dtype=torch.long, device=device)
        self.model, self.cache, self.kw = model, cache, cache_kwarg(model)
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):  # warm-up on a side stream, as capture requires
            for _ in range(2):
                self._forward()
        torch.cuda.current_stream(device).wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.next = self._forward()

    def _forward(self) -> torch.Tensor:
        # transformers' static layers (5.x) write at their own running count, not at
        # cache_position: inside the graph it is set from the position buffer on every replay
        for layer in getattr(self.cache, "layers", ()):
            count = getattr(layer, "cumulative_length", None)
            if isinstance(count, torch.Tensor):
                count.copy_(self.pos.reshape(count.shape).to(count.dtype))
        logits = self.model(
            input_ids=self.tok, **{self.kw: self.cache}, cache_position=self.pos, use_cache=True
        ).logits
        return logits[0, -1].argmax()

    def __call__(self, token: int, position: int) -> int:
        self.tok.fill_(token)
        self.pos.fill_(position)
        self.graph.replay()
        return int(self.next)
