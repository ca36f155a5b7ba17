"""MoE layers of a checkpoint: its per-expert weights grouped into one entry per experts module.

Formats store experts two ways, and both are read here into one :class:`ExpertsEntry`:

- one layer per expert and projection, ``<base>.experts.<e>.<proj>`` (GPTQ, AWQ,
  compressed-tensors, FP8, bitsandbytes ... on Mixtral's ``w1``/``w3``/``w2`` and everyone else's
  ``gate_proj``/``up_proj``/``down_proj``), and gpt-oss's stacked MXFP4 ``gate_up_proj``/``down_proj``,
  listed per expert by its reader as ``<base>.experts.<e>.gate_up_proj``;
- GGUF's stacked ``blk.<L>.ffn_{gate,up,down}_exps``, listed per expert as ``<stem>.<e>``.

Every expert of a projection must be there (0..E-1), with one shape; projections must agree
(gate and up [I, H], down [H, I], a fused gate_up [2I, H]). Any violation is one error naming the
layer, expected and found. :func:`build_experts` reads an entry into a ready
:class:`~quantrt.moe.QuantExperts`, this rank's part only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import CheckpointError
from ..formats.base import LayerEntry, natural_key

#: ``<base>.experts.<e>.<proj>`` and the projection each name stands for
_PER_EXPERT = re.compile(
    r"^(?P<base>.+\.experts)\.(?P<e>\d+)\.(?P<proj>gate_proj|up_proj|down_proj|w1|w2|w3|gate_up_proj)$"
)
_PROJ = {
    "gate_proj": "gate",
    "w1": "gate",
    "up_proj": "up",
    "w3": "up",
    "down_proj": "down",
    "w2": "down",
    "gate_up_proj": "gate_up",
}
#: most experts one MoE layer may list (DeepSeek-V3 has 256; a header claiming more is refused)
MAX_EXPERTS = 1 << 14


@dataclass
class ExpertsEntry:
    """One MoE layer's experts: ``projections[proj][e]`` is expert ``e``'s entry for ``proj``
    (``gate``, ``up``, ``down``, or ``gate_up`` when stored fused)."""

    prefix: str
    num_experts: int
    projections: dict[str, dict[int, LayerEntry]]
    #: GGUF block index (None for HF-named checkpoints)
    layer: int | None = None
    #: a fused gate_up whose rows alternate gate and up (gpt-oss), reordered at load
    interleaved: bool = False
    notes: list[str] = field(default_factory=list)

    def first(self, proj: str) -> LayerEntry:
        return self.projections[proj][0]

    @property
    def fused(self) -> bool:
        return "gate_up" in self.projections

    @property
    def quantized(self) -> bool:
        return any(e.quantized for p in self.projections.values() for e in p.values())

    @property
    def hidden_size(self) -> int:
        return self.first("down").N

    @property
    def intermediate_size(self) -> int:
        return self.first("down").K

    def scheme(self, proj: str) -> Any:
        key = "gate_up" if self.fused and proj in ("gate", "up") else proj
        return self.first(key).scheme

    def has_bias(self) -> bool:
        return self.first("down").bias is not None

    def stored_names(self) -> list[str]:
        return [n for p in self.projections.values() for e in p.values() for n in e.stored_names()]


def _gguf(prefix: str) -> tuple[int, str, int] | None:
    """(layer, projection, expert) of a GGUF expert ``blk.<L>.ffn_<proj>_exps.<e>``."""
    from ..formats.gguf_arch import expert_stack

    stem, _, e = prefix.rpartition(".")
    found = expert_stack(stem) if e.isdigit() else None
    return None if found is None else (found[0], found[1], int(e))


def is_expert_name(prefix: str) -> bool:
    """Whether a layer prefix names one expert's projection, in either naming."""
    return _PER_EXPERT.match(prefix) is not None or _gguf(prefix) is not None


def find_experts(layers: Mapping[str, LayerEntry], where: str) -> dict[str, ExpertsEntry]:
    """Group a checkpoint's per-expert layers into MoE layers (see the module docstring)."""
    found: dict[str, dict[str, dict[int, LayerEntry]]] = {}
    gguf_layer: dict[str, int] = {}
    for prefix, entry in layers.items():
        m = _PER_EXPERT.match(prefix)
        if m is not None:
            base, e, proj = m["base"], int(m["e"]), m["proj"]
            proj = _PROJ[proj]
        else:
            g = _gguf(prefix)
            if g is None:
                if entry.kind == "expert":
                    raise CheckpointError(f"{where}: expert weight {prefix!r} does not name its MoE layer")
                continue
            layer, proj, e = g
            base = f"blk.{layer}.ffn_exps"
            gguf_layer[base] = layer
        if e >= MAX_EXPERTS:
            raise CheckpointError(f"{where}: {prefix}: expert index {e} exceeds the bound of {MAX_EXPERTS}")
        found.setdefault(base, {}).setdefault(proj, {})[e] = entry
    out = {}
    for base in sorted(found, key=natural_key):
        entry = ExpertsEntry(base, 0, found[base], gguf_layer.get(base))
        _check(entry, where)
        out[base] = entry
    return out


def _check(entry: ExpertsEntry, where: str) -> None:
    """Every expert present, one shape per projection, projections that fit together."""
    p = entry.projections
    name = f"{where}: MoE layer {entry.prefix}"
    have = set(p)
    if have not in ({"gate", "up", "down"}, {"gate_up", "down"}):
        raise CheckpointError(
            f"{name}: expected projections gate, up and down (or gate_up and down), found {', '.join(sorted(have))}"
        )
    counts = {proj: len(ex) for proj, ex in p.items()}
    E = max(counts.values())
    for proj, ex in p.items():
        missing = sorted(set(range(E)) - set(ex))
        if missing or max(ex) >= E:
            raise CheckpointError(
                f"{name}: {proj} has experts {_ranges(sorted(ex))}, expected 0..{E - 1}"
                + (f" (missing {_ranges(missing)})" if missing else "")
            )
        shapes = {(x.N, x.K) for x in ex.values()}
        schemes = {x.scheme for x in ex.values()}
        if len(shapes) > 1 or len(schemes) > 1:
            raise CheckpointError(
                f"{name}: the experts of {proj} differ: shapes {sorted(shapes)}, schemes {sorted(map(str, schemes))}"
            )
        biased = {x.bias is not None for x in ex.values()}
        if len(biased) > 1:
            raise CheckpointError(f"{name}: only some experts of {proj} have a bias")
    entry.num_experts = E
    H, Inter = entry.first("down").N, entry.first("down").K
    want = {"gate": (Inter, H), "up": (Inter, H), "gate_up": (2 * Inter, H)}
    for proj in p.keys() - {"down"}:
        got = (entry.first(proj).N, entry.first(proj).K)
        if got != want[proj]:
            raise CheckpointError(
                f"{name}: {proj} is {got[0]}x{got[1]} (out x in), expected {want[proj][0]}x{want[proj][1]} "
                f"to match down ({H}x{Inter})"
            )
    biased = {proj: entry.first(proj).bias is not None for proj in p}
    if len(set(biased.values())) > 1:
        raise CheckpointError(f"{name}: some projections have a bias and others not: {biased}")
    quant = {proj: entry.first(proj).quantized for proj in p}
    if len(set(quant.values())) > 1:
        raise CheckpointError(f"{name}: some projections are quantized and others dense: {quant}")
    if "gate_up" in p and any("interleave" in n for n in entry.first("gate_up").notes):
        entry.interleaved = True
        entry.notes.append("gate_up rows alternate gate and up; reordered to gate rows, then up rows")


def _ranges(xs: list[int]) -> str:
    if not xs:
        return "none"
    out, start, prev = [], xs[0], xs[0]
    for x in [*xs[1:], None]:
        if x is not None and x == prev + 1:
            prev = x
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if x is not None:
            start = prev = x
    return ", ".join(out[:6]) + (" ..." if len(out) > 6 else "")


def _deinterleave(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Rows 0, 2, 4, ... then 1, 3, 5, ... along ``dim``."""
    n = t.shape[dim]
    perm = torch.cat([torch.arange(0, n, 2), torch.arange(1, n, 2)])
    return t.index_select(dim, perm)


def build_experts(
    ckpt: Any,
    entry: ExpertsEntry,
    *,
    device: Any = "cpu",
    act_dtype: torch.dtype = torch.bfloat16,
    activation: Any = "silu",
    tp_rank: int = 0,
    tp_size: int = 1,
    ep_rank: int = 0,
    ep_size: int = 1,
    reduce: bool = False,
    group: Any = None,
    overrides: Any = None,
    prefix: str | None = None,
) -> Any:
    """A ready :class:`~quantrt.moe.QuantExperts` for ``entry``: only this rank's experts are read."""
    from ..errors import ShardError
    from ..moe import QuantExperts

    if not entry.quantized:
        raise CheckpointError(
            f"{ckpt.path}: MoE layer {entry.prefix} is stored dense; it has no quantized experts"
        )
    fused = entry.fused
    gate_key = "gate_up" if fused else "gate"
    layer = QuantExperts(
        entry.num_experts,
        entry.hidden_size,
        entry.intermediate_size,
        entry.scheme("gate"),
        up_scheme=entry.scheme("up"),
        down_scheme=entry.scheme("down"),
        activation=activation,
        bias=entry.has_bias(),
        tp_rank=tp_rank,
        tp_size=tp_size,
        ep_rank=ep_rank,
        ep_size=ep_size,
        act_dtype=act_dtype,
        device=device,
        adapter=entry.first(gate_key).adapter,
        down_adapter=entry.first("down").adapter,
        prefix=prefix or entry.prefix,
        reduce=reduce,
        group=group,
    )
    for e in layer.local:
        for proj, experts in entry.projections.items():
            le = experts[e]
            tensors = ckpt.read(le)
            bias = ckpt._read(le, "bias", le.bias) if le.bias is not None else None
            if entry.interleaved and proj == "gate_up":
                specs = le.adapter.tensor_specs(le.scheme, le.N, le.K)
                for role, t in tensors.items():
                    spec = specs.get(role)
                    if spec is not None and spec.output_dim is not None and spec.output_unit == 1:
                        tensors[role] = _deinterleave(t, spec.output_dim)
                    elif spec is not None and spec.output_dim is not None:
                        raise CheckpointError(
                            f"{ckpt.path}: {le.prefix}: {role} packs rows; cannot reorder gate/up"
                        )
                bias = None if bias is None else _deinterleave(bias, 0)
            for role, t in tensors.items():
                try:
                    layer.load(proj, e, role, t)
                except ShardError as err:
                    what = (
                        ckpt.index.where(le.tensors[role]) if role in le.tensors else f"{le.prefix} ({role})"
                    )
                    raise ShardError(f"{what}: {err}") from None
            if bias is not None:
                layer.load(proj, e, "bias", bias)
    try:
        return layer.process_weights_after_loading(overrides)
    except CheckpointError as err:
        raise CheckpointError(f"{ckpt.path}: MoE layer {entry.prefix}: {err}") from None
