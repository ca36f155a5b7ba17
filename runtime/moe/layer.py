"""The experts of one MoE layer, and an MoE block around them.

:class:`QuantExperts` is the grouped counterpart of :class:`~quantrt.layers.QuantLinear`: ``E``
experts, each a gate and an up projection (fused into one ``gate_up`` of [2I] rows when their
schemes agree) and a down projection, loaded expert by expert in checkpoint layout (the format's
adapter, this rank's part taken as QuantLinear takes it), stacked into canonical tensors with a
leading expert dim, and run by the grouped kernels dispatch picks (``LayerSpec(op="grouped")``),
one per projection. Its ``forward(hidden, topk_ids, topk_weights)`` is the call transformers
makes on a model's ``experts`` module, so a model keeps its own router and shared experts.

Parallelism is data, as for linear layers: tensor parallelism cuts every expert (gate and up by
columns of I, down by rows of I); expert parallelism gives each rank a contiguous run of experts
(``expert_map``: global id -> local id or -1). Either way each rank holds part of every output
row, and the ranks' outputs sum (``group``: the process group quantrt all-reduces over).

:class:`QuantMoE` adds the router (:class:`~quantrt.moe.routing.Router`) and shared experts, for
callers that want the whole block.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..dispatch import Selection, build, device_of, torch_device_of
from ..env import Overrides
from ..errors import ShardError
from ..layers import QuantLinear
from ..schemes import Scheme, parse_scheme
from ..specs import LayerSpec
from .activation import Activation, activation_of
from .batch import ExpertBatch
from .canonical import CanonicalExperts
from .prepared import PreparedExperts
from .routing import Router, route

#: the projections an expert stores, and the fused one they may arrive as
PROJECTIONS = ("gate", "up", "down")
FUSED = "gate_up"


def _scheme(s: Scheme | str) -> Scheme:
    return parse_scheme(s) if isinstance(s, str) else s


def expert_range(num_experts: int, ep_rank: int, ep_size: int) -> range:
    """The global experts rank ``ep_rank`` of ``ep_size`` holds: a contiguous run, the first
    ``E % ep_size`` ranks holding one more."""
    base, extra = divmod(num_experts, ep_size)
    start = ep_rank * base + min(ep_rank, extra)
    return range(start, start + base + (ep_rank < extra))


class _Projection:
    """One grouped projection once prepared: its kernel, its state, its stacked bias."""

    __slots__ = ("bias", "kernel", "selection", "state")

    def __init__(self, kernel: Any, state: PreparedExperts, selection: Selection, bias: torch.Tensor | None):
        self.kernel, self.state, self.selection, self.bias = kernel, state, selection, bias


_LIVE: weakref.WeakValueDictionary[int, QuantExperts] = weakref.WeakValueDictionary()
_IDS = itertools.count(1)
_IDS_LOCK = threading.Lock()


class QuantExperts(nn.Module):
    """``num_experts`` experts of hidden size ``hidden_size`` and width ``intermediate_size`` on one
    rank (see the module docstring).

    ``scheme`` is every projection's scheme unless ``gate_scheme``/``up_scheme``/``down_scheme``
    say otherwise (a GGUF Q4_K_M stores down in Q6_K). ``adapter`` reads the checkpoint's layout
    (canonical tensors when None); ``down_adapter`` when down is stored otherwise.
    """

    def __init__(
        self,
        num_experts: int,
        hidden_size: int,
        intermediate_size: int,
        scheme: Scheme | str,
        *,
        gate_scheme: Scheme | str | None = None,
        up_scheme: Scheme | str | None = None,
        down_scheme: Scheme | str | None = None,
        activation: str | Activation = "silu",
        bias: bool = False,
        tp_rank: int = 0,
        tp_size: int = 1,
        ep_rank: int = 0,
        ep_size: int = 1,
        act_dtype: torch.dtype = torch.bfloat16,
        device: Any = "cpu",
        adapter: Any = None,
        down_adapter: Any = None,
        prefix: str = "",
        m_hint: int | None = None,
        reduce: bool = False,
        group: Any = None,
    ) -> None:
        super().__init__()
        if num_experts < 1 or hidden_size < 1 or intermediate_size < 1:
            raise ValueError(
                f"experts need positive sizes, found E={num_experts} H={hidden_size} I={intermediate_size}"
            )
        if not 0 <= tp_rank < tp_size or not 0 <= ep_rank < ep_size:
            raise ValueError(f"rank out of range: tp {tp_rank}/{tp_size}, ep {ep_rank}/{ep_size}")
        if ep_size > num_experts:
            raise ShardError(
                f"{prefix or 'experts'}: {num_experts} experts cannot spread over {ep_size} ranks"
            )
        if intermediate_size % tp_size:
            raise ShardError(
                f"{prefix or 'experts'}: intermediate size {intermediate_size} does not divide by {tp_size} ranks"
            )
        self.num_experts, self.hidden_size, self.intermediate_size = (
            num_experts,
            hidden_size,
            intermediate_size,
        )
        self.tp_rank, self.tp_size, self.ep_rank, self.ep_size = tp_rank, tp_size, ep_rank, ep_size
        self.local = expert_range(num_experts, ep_rank, ep_size)
        self.act = activation_of(activation)
        self.act_dtype, self.has_bias, self.prefix, self.m_hint = act_dtype, bias, prefix, m_hint
        self.device, self.plan_device = torch_device_of(device), device_of(device)
        #: sum the ranks' outputs (all_reduce over ``group``; None: torch.distributed's default group)
        self.reduce, self.group = reduce and (tp_size > 1 or ep_size > 1), group
        base = _scheme(scheme)
        self.schemes = {
            "gate": _scheme(gate_scheme) if gate_scheme is not None else base,
            "up": _scheme(up_scheme) if up_scheme is not None else base,
            "down": _scheme(down_scheme) if down_scheme is not None else base,
        }
        self.fused = self.schemes["gate"] == self.schemes["up"]
        self.adapters = {"gate": adapter, "up": adapter, "down": down_adapter or adapter}
        emap = torch.full((num_experts,), -1, dtype=torch.int32)
        emap[self.local.start : self.local.stop] = torch.arange(len(self.local), dtype=torch.int32)
        #: global expert id -> local id, -1 where another rank holds it (None: every expert is local)
        self.register_buffer("expert_map", emap.to(self.device) if ep_size > 1 else None, persistent=False)
        self._slots: dict[str, list[QuantLinear]] | None = self._make_slots()
        self._gate_up: list[_Projection] = []
        self._down: _Projection | None = None
        with _IDS_LOCK:
            self.id = next(_IDS)
        _LIVE[self.id] = self

    # -- loading ---------------------------------------------------------------------------------
    def _make_slots(self) -> dict[str, list[QuantLinear]]:
        """One loading layer per local expert and projection (parameters in checkpoint layout)."""
        H, Inter, tp = self.hidden_size, self.intermediate_size, self.tp_size
        col = "column" if tp > 1 else None
        row = "row" if tp > 1 else None
        common = dict(
            tp_rank=self.tp_rank, tp_size=tp, act_dtype=self.act_dtype, device="cpu", bias=self.has_bias
        )
        slots: dict[str, list[QuantLinear]] = {}
        for e in self.local:
            p = f"{self.prefix}.{e}" if self.prefix else str(e)
            if self.fused:
                slots.setdefault(FUSED, []).append(
                    QuantLinear(
                        H, 2 * Inter, self.schemes["gate"], output_sizes=[Inter, Inter], shard_names=["gate", "up"],
                        parallel=col, adapter=self.adapters["gate"], prefix=f"{p}.{FUSED}", **common,
                    )
                )  # fmt: skip
            else:
                for proj in ("gate", "up"):
                    slots.setdefault(proj, []).append(
                        QuantLinear(
                            H, Inter, self.schemes[proj], parallel=col, adapter=self.adapters[proj],
                            prefix=f"{p}.{proj}", **common,
                        )
                    )  # fmt: skip
            slots.setdefault("down", []).append(
                QuantLinear(
                    Inter, H, self.schemes["down"], parallel=row, adapter=self.adapters["down"],
                    prefix=f"{p}.down", **common,
                )
            )  # fmt: skip
        return slots

    def holds(self, expert: int) -> bool:
        """Whether this rank holds global expert ``expert``."""
        return expert in self.local

    def load(self, proj: str, expert: int, name: str, tensor: torch.Tensor) -> bool:
        """Fill tensor ``name`` (a stored role, or ``bias``) of projection ``proj`` (gate, up, down,
        or gate_up for both stored as one, gate rows first) of global expert ``expert`` from its full
        checkpoint tensor. Returns False, reading nothing, for an expert another rank holds."""
        if self._slots is None:
            raise RuntimeError(f"{self.prefix or 'experts'}: already processed")
        if not 0 <= expert < self.num_experts:
            raise ShardError(
                f"{self.prefix or 'experts'}: expert {expert} is outside [0, {self.num_experts})"
            )
        if expert not in self.local:
            return False
        i = expert - self.local.start
        if proj == FUSED:
            if not self.fused:
                raise ShardError(
                    f"{self.prefix or 'experts'}: gate ({self.schemes['gate']}) and up ({self.schemes['up']}) "
                    "differ in scheme, so they load separately, not as gate_up"
                )
            self._slots[FUSED][i].load(name, tensor, None)
        elif proj in ("gate", "up"):
            if self.fused:
                self._slots[FUSED][i].load(name, tensor, proj)
            else:
                self._slots[proj][i].load(name, tensor, None)
        elif proj == "down":
            self._slots["down"][i].load(name, tensor, None)
        else:
            raise ShardError(
                f"{self.prefix or 'experts'}: unknown projection {proj!r}; expected gate, up, down, gate_up"
            )
        return True

    def load_canonical(self, proj: str, expert: int, weight: Any, bias: torch.Tensor | None = None) -> bool:
        """Load one expert's projection from canonical tensors (the full, unsharded weight)."""
        if expert not in self.local:
            return False
        for name, t in weight.tensors.items():
            if name in ("input_scale", "input_global_scale") and proj == FUSED:
                t = t.reshape(-1)[:1]
            self.load(proj, expert, name, t)
        if bias is not None:
            self.load(proj, expert, "bias", bias)
        return True

    def process_weights_after_loading(self, overrides: Overrides | None = None) -> QuantExperts:
        """Check every expert arrived, stack them, pick each projection's grouped kernel, prepare."""
        if self._slots is None:
            raise RuntimeError(f"{self.prefix or 'experts'}: already processed")
        groups = [FUSED] if self.fused else ["gate", "up"]
        self._gate_up = [self._attach(g, overrides) for g in groups]
        self._down = self._attach("down", overrides)
        self._slots = None
        return self

    def _attach(self, key: str, overrides: Overrides | None) -> _Projection:
        assert self._slots is not None
        slots = self._slots[key]
        weight = CanonicalExperts.stack([s.canonical() for s in slots])
        first = slots[0]
        spec = LayerSpec(
            first.scheme,
            first.in_features,
            first.out_features,
            first.K_part,
            first.N_part,
            act_dtype=self.act_dtype,
            bias=self.has_bias,
            op="grouped",
            num_experts=len(self.local),
            m_hint=self.m_hint,
            output_sizes=first.output_sizes_part,
            parallel=first.parallel,
            tp_size=self.tp_size,
        )
        kernel, sel = build(spec, self.plan_device, overrides)
        state = kernel.prepare(weight.to(self.device), spec)
        bias = None
        if self.has_bias and not (key == "down" and self.tp_rank > 0):  # a row-parallel bias is added once
            bias = torch.stack([s.bias.data for s in slots]).to(self.device, self.act_dtype)
        return _Projection(kernel, state, sel, bias)

    @classmethod
    def from_canonical(
        cls,
        gate_up: CanonicalExperts | Sequence[CanonicalExperts],
        down: CanonicalExperts,
        *,
        gate_up_bias: torch.Tensor | None = None,
        down_bias: torch.Tensor | None = None,
        overrides: Overrides | None = None,
        **kw: Any,
    ) -> QuantExperts:
        """Ready experts from stacked canonical weights: ``gate_up`` [E, 2I, H] (gate rows first) or
        its parts (gate, up), ``down`` [E, H, I]."""
        parts = [gate_up] if isinstance(gate_up, CanonicalExperts) else list(gate_up)
        E, H = down.E, down.N
        Inter = sum(p.N for p in parts) // 2
        schemes = (
            {"scheme": parts[0].scheme, "down_scheme": down.scheme}
            if len(parts) == 1
            else {"scheme": parts[0].scheme, "up_scheme": parts[1].scheme, "down_scheme": down.scheme}
        )
        layer = cls(E, H, Inter, bias=gate_up_bias is not None, **schemes, **kw)
        for e in range(E):
            if not layer.holds(e):
                continue
            if len(parts) == 1:
                layer.load_canonical(
                    FUSED, e, parts[0].expert(e), None if gate_up_bias is None else gate_up_bias[e]
                )
            else:
                for proj, p in zip(("gate", "up"), parts):
                    b = (
                        None
                        if gate_up_bias is None
                        else gate_up_bias[e][:Inter]
                        if proj == "gate"
                        else gate_up_bias[e][Inter:]
                    )
                    layer.load_canonical(proj, e, p.expert(e), b)
            layer.load_canonical("down", e, down.expert(e), None if down_bias is None else down_bias[e])
        return layer.process_weights_after_loading(overrides)

    # -- running ---------------------------------------------------------------------------------
    @property
    def kernel_names(self) -> dict[str, str]:
        """The grouped kernel of each projection."""
        if self._down is None:
            raise RuntimeError(
                f"{self.prefix or 'experts'}: not processed yet (call process_weights_after_loading)"
            )
        names = [FUSED] if self.fused else ["gate", "up"]
        out = {n: p.kernel.name for n, p in zip(names, self._gate_up)}
        out["down"] = self._down.kernel.name
        return out

    @property
    def selections(self) -> dict[str, Selection]:
        names = [FUSED] if self.fused else ["gate", "up"]
        out = {n: p.selection for n, p in zip(names, self._gate_up)}
        if self._down is not None:
            out["down"] = self._down.selection
        return out

    def forward(
        self, hidden_states: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor
    ) -> torch.Tensor:
        """``sum_j topk_weights[m, j] * expert_{topk_ids[m, j]}(hidden[m])`` for every token m
        (this rank's part; summed over the ranks when built with ``reduce=True``)."""
        lead = hidden_states.shape[:-1]
        x = hidden_states.reshape(-1, self.hidden_size)
        k = topk_ids.shape[-1]
        ids = topk_ids.reshape(x.shape[0], k)
        w = topk_weights.reshape(x.shape[0], k)
        if torch.compiler.is_compiling():
            y = torch.ops.quantrt.experts(x, ids, w, self.id)
        else:
            y = self.run(x, ids, w)
        if self.reduce:
            import torch.distributed as dist

            dist.all_reduce(y, group=self.group)
        return y.reshape(*lead, self.hidden_size)

    def run(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        """The eager path for ``x`` [M, H] (no collective)."""
        if self._down is None:
            raise RuntimeError(
                f"{self.prefix or 'experts'}: not processed yet (call process_weights_after_loading)"
            )
        M = topk_ids.shape[0]
        if M == 0:
            return x.new_empty((0, self.hidden_size))
        if self.expert_map is not None:
            topk_ids = self.expert_map[topk_ids.long()]
        batch = ExpertBatch(topk_ids, topk_weights, len(self.local))
        x = x.to(self.act_dtype)
        hs = [p.state(x, batch, gather=True, bias=p.bias) for p in self._gate_up]
        h = hs[0] if len(hs) == 1 else torch.cat(hs, dim=1)
        d = self._down
        into = d.state.activate_into
        if into is not None:  # the activation and the down projection's input quantization in one
            return d.state.combined(into(h, self.act), batch, bias=d.bias)
        fused = self._gate_up[0].state.activate
        a = self.act(h) if fused is None else fused(h, self.act)
        return d.state.combined(a, batch, bias=d.bias)

    def extra_repr(self) -> str:
        kern = self.kernel_names if self._down is not None else "not prepared"
        par = []
        if self.tp_size > 1:
            par.append(f"tp {self.tp_rank}/{self.tp_size}")
        if self.ep_size > 1:
            par.append(f"ep {self.ep_rank}/{self.ep_size}: experts [{self.local.start}, {self.local.stop})")
        return (
            f"E={self.num_experts}, H={self.hidden_size}, I={self.intermediate_size}, "
            f"schemes={ {k: str(v) for k, v in self.schemes.items()} }, act={self.act.describe()}, kernels={kern}"
            + (", " + ", ".join(par) if par else "")
        )


class QuantMoE(nn.Module):
    """A whole MoE block: router logits (a dense ``gate`` [E, H]), routing, the experts and
    optional shared experts (``shared``, scaled by ``sigmoid(x @ shared_gate.T)`` when given, as
    Qwen2-MoE does)."""

    def __init__(
        self,
        experts: QuantExperts,
        router: Router,
        gate_weight: torch.Tensor,
        *,
        gate_bias: torch.Tensor | None = None,
        correction_bias: torch.Tensor | None = None,
        shared: nn.Module | None = None,
        shared_gate: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        if tuple(gate_weight.shape) != (experts.num_experts, experts.hidden_size):
            raise ValueError(
                f"gate weight {list(gate_weight.shape)}: expected [{experts.num_experts}, {experts.hidden_size}]"
            )
        self.experts, self.router, self.shared = experts, router, shared
        dev = experts.device
        self.register_buffer("gate_weight", gate_weight.detach().to(dev), persistent=False)
        self.register_buffer(
            "gate_bias", None if gate_bias is None else gate_bias.detach().to(dev), persistent=False
        )
        self.register_buffer(
            "correction_bias",
            None if correction_bias is None else correction_bias.detach().to(dev),
            persistent=False,
        )
        self.register_buffer(
            "shared_gate", None if shared_gate is None else shared_gate.detach().to(dev), persistent=False
        )

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(topk_weights, topk_ids)`` for ``x`` [M, H]."""
        logits = F.linear(x.to(self.gate_weight.dtype), self.gate_weight, self.gate_bias)
        return route(logits, self.router, self.correction_bias)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        lead = hidden_states.shape[:-1]
        x = hidden_states.reshape(-1, hidden_states.shape[-1])
        weights, ids = self.route(x)
        y = self.experts(x, ids, weights)
        if self.shared is not None:
            s = self.shared(x)
            if self.shared_gate is not None:
                s = torch.sigmoid(F.linear(x.to(self.shared_gate.dtype), self.shared_gate)).to(s.dtype) * s
            y = y + s.to(y.dtype)
        return y.reshape(*lead, y.shape[-1])


# -- the one traced op of an MoE layer ---------------------------------------------------------------

_LIB = torch.library.Library("quantrt", "FRAGMENT")
_LIB.define("experts(Tensor x, Tensor topk_ids, Tensor topk_weights, int layer) -> Tensor")


def _live(layer: int) -> QuantExperts:
    m = _LIVE.get(layer)
    if m is None:
        raise RuntimeError(f"quantrt: MoE layer #{layer} no longer exists (it was freed)")
    return m


def _experts_impl(
    x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, layer: int
) -> torch.Tensor:
    return _live(layer).run(x, topk_ids, topk_weights)


def _experts_fake(
    x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, layer: int
) -> torch.Tensor:
    m = _live(layer)
    return x.new_empty((x.shape[0], m.hidden_size), dtype=m.act_dtype)


_LIB.impl("experts", _experts_impl, "CompositeExplicitAutograd")
torch.library.register_fake("quantrt::experts", _experts_fake, lib=_LIB)
