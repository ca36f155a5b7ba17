"""Fill a transformers model, built on the meta device, from a checkpoint, one tensor at a time.

The model comes from the checkpoint's config (for GGUF, rebuilt from its metadata). Every
linear module the checkpoint stores becomes the layer :meth:`Checkpoint.linear` builds (a
QuantLinear whose kernel dispatch chose, or a dense layer), a quantized embedding a
:class:`QuantEmbedding`, each MoE experts module a :class:`~quantrt.moe.QuantExperts` over the
checkpoint's MoE layer; every other parameter is read from its tensor. Nothing is dense that the
file stores quantized, so host memory stays near the file's size, save an MoE router ([E, H]),
which transformers' router multiplies by itself and is dequantized at load.

Everything is checked: a layer whose stored shape disagrees with the config, a parameter no
tensor fills, a tensor nothing reads (unless the format knows it is harmless: then a warning
names it). On any error the half-built model is released before the error is raised.
"""

from __future__ import annotations

import gc
import logging
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import CheckpointError
from .host_memory import release_freed
from .modules import GatherColumns, QuantEmbedding, RowParallel, TiedEmbedding
from .parallel import NONE, LayerCut, TensorParallel, local_config, plan

log = logging.getLogger("quantrt.models")

#: how many names an error lists before "and N more"
SHOW = 8


@dataclass
class LoadReport:
    """What loading did: the kernel of every layer, the time, and what was left unread and why."""

    path: str
    format: str
    device: str
    dtype: str
    seconds: float = 0.0
    kernels: dict[str, str] = field(default_factory=dict)
    ignored: dict[str, str] = field(default_factory=dict)
    bytes_read: int = 0
    #: decoder layer index -> the checkpoint's KV-cache scales for it (quantrt.kv.kv_cache uses them)
    kv_scales: dict[int, Any] = field(default_factory=dict)

    def plan_summary(self) -> dict[str, int]:
        """Kernel -> number of layers it runs."""
        return dict(Counter(self.kernels.values()).most_common())

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "format": self.format,
            "device": self.device,
            "dtype": self.dtype,
            "load_seconds": round(self.seconds, 3),
            "bytes_read": self.bytes_read,
            "plan": self.plan_summary(),
            "layers": self.kernels,
            "ignored_tensors": self.ignored,
            "kv_cache_scales": {str(i): str(kv.scheme) for i, kv in sorted(self.kv_scales.items())},
        }


def _layer_index(model: nn.Module, attn: str) -> int | None:
    """The decoder layer an attention module's prefix belongs to (its ``layer_idx``)."""
    try:
        idx = getattr(model.get_submodule(attn), "layer_idx", None)
    except AttributeError:
        idx = None
    if idx is None:
        m = re.search(r"\.layers\.(\d+)\.", attn + ".")
        idx = int(m.group(1)) if m else None
    return idx


def _names(items: list[str]) -> str:
    head = ", ".join(items[:SHOW])
    return head + (f" and {len(items) - SHOW} more" if len(items) > SHOW else "")


def kernel_label(module: nn.Module) -> str:
    """The kernel a layer runs, for plans and reports."""
    inner = getattr(module, "layer", module)
    if hasattr(inner, "kernel_names"):
        return "+".join(inner.kernel_names)
    if hasattr(inner, "kernel_name"):
        return inner.kernel_name
    if isinstance(inner, QuantEmbedding):
        return f"embedding lookup ({inner.scheme})"
    return f"torch {type(inner).__name__}"


def build_empty(config: Any, dtype: torch.dtype) -> nn.Module:
    """The model on the meta device (parameters only: buffers such as rotary frequencies are
    computed for real, since no checkpoint stores them)."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights(include_buffers=False):
        try:
            return AutoModelForCausalLM.from_config(config, dtype=dtype)
        except ValueError as e:
            raise CheckpointError(f"transformers cannot build a causal LM from this config: {e}") from None


class ModelLoader:
    """One loading pass of ``ckpt`` into ``model`` (see the module docstring).

    ``quantized_only``: replace only the layers the checkpoint stores quantized and read nothing
    else (transformers' own loader does the rest, as when quantrt runs as its quantizer).
    """

    def __init__(
        self,
        model: nn.Module,
        ckpt: Any,
        *,
        device: torch.device,
        dtype: torch.dtype,
        tp: TensorParallel | None = None,
        full_config: Any = None,
        overrides: Any = None,
        progress: bool | None = None,
        quantized_only: bool = False,
    ) -> None:
        self.model, self.ckpt, self.device, self.dtype = model, ckpt, device, dtype
        self.tp = tp or TensorParallel()
        self.full_config = full_config if full_config is not None else model.config
        self.overrides, self.quantized_only = overrides, quantized_only
        self.progress = sys.stderr.isatty() if progress is None else progress
        self.report = LoadReport(str(ckpt.path), ckpt.format, str(device), str(dtype).replace("torch.", ""))
        self.consumed: set[str] = set()
        #: experts modules replaced by QuantExperts (transformers' loader must not look for their tensors)
        self.replaced_experts: list[str] = []
        self._bar: Any = None

    # -- the pass ------------------------------------------------------------------------------
    def run(self) -> LoadReport:
        t0 = time.perf_counter()
        from tqdm.auto import tqdm

        info = self.ckpt.index.info
        if self.quantized_only:
            names = {n for e in self.ckpt.layers.values() if e.quantized for n in e.stored_names()}
            total = sum(info[n].nbytes for n in names)
        else:
            total = sum(i.nbytes for i in info.values())
        self._bar = tqdm(
            total=total, unit="B", unit_scale=True, desc="quantrt: loading", disable=not self.progress
        )
        if self.device.type == "cuda" and self.ckpt.format != "gguf":
            self.ckpt.index.stage_to(self.device)  # dense weights stream onto the GPU (pinned chunks)
        try:
            self._src_of = {} if self.quantized_only else self._source_names()
            if not self.quantized_only:
                self._tied_output()  # first: the largest layer is built while nothing else is held
            self._layers()
            if not self.quantized_only:
                self._parameters()
                self._rotary()
                self._buffers()
                self._unread()
        finally:
            self.ckpt.index.drop_prefetched()
            self.ckpt.index.stage_to(None)
            self._bar.close()
        self.report.seconds = time.perf_counter() - t0
        return self.report

    def _read(self, name: str) -> torch.Tensor:
        t = self.ckpt.index.read(name)
        self.consumed.add(name)
        self.report.bytes_read += self.ckpt.index.info[name].nbytes
        self._bar.update(self.ckpt.index.info[name].nbytes)
        return t

    # -- linear layers and embeddings ----------------------------------------------------------
    def _layers(self) -> None:
        layers = self.ckpt.layers
        self._experts()
        grouped = self.ckpt.expert_prefixes()
        by_model_name = {self._renamed(p): e for p, e in layers.items() if p not in grouped}
        cuts = plan(self.model, self.full_config, self.tp)
        todo = [
            (name, module, by_model_name[name])
            for name, module in self.model.named_modules()
            if name in by_model_name and not (self.quantized_only and not by_model_name[name].quantized)
        ]
        for i, (name, module, entry) in enumerate(todo):
            nxt = todo[i + 1][2] if i + 1 < len(todo) else None
            if nxt is not None and not nxt.select:  # the next layer's bytes read while this one is built
                self.ckpt.index.prefetch([*nxt.tensors.values(), *([nxt.bias] if nxt.bias else [])])
            if isinstance(module, nn.Embedding):
                if entry.quantized:
                    self._quant_embedding(name, module, entry)
                continue
            if isinstance(module, nn.Linear):
                self._linear(name, module, entry, cuts.get(name, NONE))
            elif entry.quantized and _bare_weight(module, entry):
                self._dequantized_weight(name, module, entry)

    def _dequantized_weight(self, name: str, module: nn.Module, entry: Any) -> None:
        """A quantized weight whose module is not a linear layer but reads ``self.weight`` itself (an
        MoE router, ``mlp.gate``, that bitsandbytes quantizes by default): it is small ([E, H]) and
        the module's own code multiplies by it, so it is dequantized once, here, and held as a plain
        tensor (outside the state dict, so transformers' loader neither fills nor re-creates it)."""
        from ..checkpoint.checkpoint import QuantizedWeight

        w = QuantizedWeight(name, entry, self.ckpt).dequantize()
        dtype = module.weight.dtype
        del module._parameters["weight"]
        module.weight = w.to(self.device, dtype if dtype.is_floating_point else self.dtype)
        module._is_hf_initialized = True
        self.report.kernels[name] = f"dequantized at load ({entry.scheme}; the module reads its weight)"
        prefix = entry.prefix + "."
        self._consume([*entry.stored_names(), *(n for n in self.ckpt.index.names() if n.startswith(prefix))])

    # -- MoE experts --------------------------------------------------------------------------
    def _renamed(self, name: str) -> str:
        """A checkpoint name as transformers renames it for this model (Mixtral's
        ``block_sparse_moe`` is the model's ``mlp``); unchanged for GGUF, whose names are mapped apart."""
        if self.ckpt.format == "gguf":
            return name
        if not hasattr(self, "_renames"):
            from transformers.conversion_mapping import get_checkpoint_conversion_mapping
            from transformers.core_model_loading import WeightRenaming

            mapping = get_checkpoint_conversion_mapping(getattr(self.full_config, "model_type", "")) or []
            self._renames = [t for t in mapping if type(t) is WeightRenaming]
        for t in self._renames:
            name = t.rename_source_key(name)[0]
        return name

    def _experts(self) -> None:
        """Each experts module of the model (transformers' ``experts(hidden, ids, weights)`` with
        stacked ``gate_up_proj``/``down_proj``) becomes a QuantExperts over the checkpoint's MoE layer,
        or, where the checkpoint stores the experts dense, takes their stacked tensors."""
        found = self.ckpt.experts
        if not found:
            return
        modules = {n: m for n, m in self.model.named_modules() if _is_experts(m)}
        by_name: dict[str, Any] = {}
        for prefix, x in found.items():
            name = self._experts_module(prefix, x, modules)
            if name in by_name:
                raise CheckpointError(
                    f"{self.ckpt.path}: MoE layers {by_name[name].prefix} and {prefix} both map to {name}"
                )
            by_name[name] = x
        for name, x in by_name.items():
            module = modules[name]
            if (module.num_experts, _hidden(module)) != (x.num_experts, x.hidden_size):
                raise CheckpointError(
                    f"{self.ckpt.path}: MoE layer {x.prefix}: the config makes {name} {module.num_experts} "
                    f"experts of hidden size {_hidden(module)}, the checkpoint stores {x.num_experts} of "
                    f"{x.hidden_size}"
                )
            if not x.quantized:
                if not self.quantized_only:
                    self._dense_experts(name, module, x)
                continue
            layer = self.ckpt.experts_layer(
                x.prefix,
                device=self.device,
                act_dtype=self.dtype,
                activation=_activation_of(module, self.full_config),
                tp_rank=self.tp.rank,
                tp_size=self.tp.world,
                reduce=self.tp.world > 1,
                group=self.tp.group,
                overrides=self.overrides,
                prefix=name,
            )
            self.model.set_submodule(name, layer)
            self.replaced_experts.append(name)
            self.report.kernels[name] = "+".join(dict.fromkeys(layer.kernel_names.values()))
            self._consume(x.stored_names())

    def _experts_module(self, prefix: str, x: Any, modules: dict[str, nn.Module]) -> str:
        if x.layer is not None:  # GGUF: blk.<L>
            want = [n for n in modules if re.search(rf"(^|\.)layers\.{x.layer}\.", n)]
        else:
            renamed = self._renamed(prefix)
            want = [renamed] if renamed in modules else []
        if len(want) != 1:
            have = ", ".join(list(modules)[:4]) or "none"
            raise CheckpointError(
                f"{self.ckpt.path}: MoE layer {prefix} matches no experts module of the model its config "
                f"describes ({have})"
            )
        return want[0]

    def _dense_experts(self, name: str, module: nn.Module, x: Any) -> None:
        """Unquantized per-expert weights stacked into the model's own experts parameters."""
        E = x.num_experts

        def weight(proj: str, e: int) -> torch.Tensor:
            le = x.projections[proj][e]
            return self._read(le.tensors["weight"])

        gate_up = [
            weight("gate_up", e) if x.fused else torch.cat([weight("gate", e), weight("up", e)])
            for e in range(E)
        ]
        down = [weight("down", e) for e in range(E)]
        gu, dn = torch.stack(gate_up), torch.stack(down)
        if module.gate_up_proj.shape != gu.shape:  # gpt-oss keeps its experts [E, in, out]
            gu, dn = gu.transpose(1, 2), dn.transpose(1, 2)
        for pname, t in (("gate_up_proj", gu), ("down_proj", dn)):
            p = getattr(module, pname)
            if tuple(p.shape) != tuple(t.shape):
                raise CheckpointError(
                    f"{self.ckpt.path}: MoE layer {x.prefix}: expected {pname} {list(p.shape)} for {name}, "
                    f"found {list(t.shape)}"
                )
            module._parameters[pname] = nn.Parameter(t.to(self.device, p.dtype), requires_grad=False)
        if x.has_bias():
            raise CheckpointError(
                f"{self.ckpt.path}: MoE layer {x.prefix}: dense experts with biases are not read"
            )

    def _consume(self, names: list[str]) -> None:
        for n in names:
            if n not in self.consumed:
                self.consumed.add(n)
                self.report.bytes_read += self.ckpt.index.info[n].nbytes
                self._bar.update(self.ckpt.index.info[n].nbytes)

    def _check_shape(self, name: str, module: nn.Module, entry: Any, cut: LayerCut) -> None:
        # a gathered column-parallel layer (the output projection) keeps its full width in the model
        split = cut.parallel == "column" and cut.collective != "gather"
        n = module.out_features * (cut.tp_size if split else 1)
        k = module.in_features * (cut.tp_size if cut.parallel == "row" else 1)
        if (entry.N, entry.K) != (n, k):
            raise CheckpointError(
                f"{self.ckpt.path}: layer {name}: the config makes it {n}x{k} (out x in), the checkpoint "
                f"stores {entry.N}x{entry.K}"
            )
        has_bias = getattr(module, "bias", None) is not None
        if has_bias != (entry.bias is not None):
            raise CheckpointError(
                f"{self.ckpt.path}: layer {name}: the config "
                + (
                    "has a bias the checkpoint does not store"
                    if has_bias
                    else "has no bias, but the checkpoint stores "
                )
                + ("" if has_bias else f"{entry.bias}")
            )

    def _linear(self, name: str, module: nn.Linear, entry: Any, cut: LayerCut) -> None:
        self._check_shape(name, module, entry, cut)
        layer = self.ckpt.linear(
            name,
            device=self.device,
            act_dtype=self.dtype,
            parallel=cut.parallel,
            tp_rank=cut.tp_rank,
            tp_size=cut.tp_size,
            overrides=self.overrides,
        )
        self._place(name, layer, cut, entry)

    def _place(self, name: str, layer: nn.Module, cut: LayerCut, entry: Any) -> None:
        if cut.collective == "sum":
            layer = RowParallel(layer, self.tp.group)
        elif cut.collective == "gather":
            layer = GatherColumns(layer, self.tp.group, cut.tp_size)
        self.model.set_submodule(name, layer)
        self.report.kernels[name] = kernel_label(layer)
        self._consume(entry.stored_names())
        release_freed()  # the layer's read buffers and temporaries, back to the system

    def _quant_embedding(self, name: str, module: nn.Embedding, entry: Any) -> None:
        from ..checkpoint.checkpoint import QuantizedWeight

        if (entry.N, entry.K) != (module.num_embeddings, module.embedding_dim):
            raise CheckpointError(
                f"{self.ckpt.path}: embedding {name}: the config makes it {module.num_embeddings}x"
                f"{module.embedding_dim}, the checkpoint stores {entry.N}x{entry.K}"
            )
        scale = getattr(module, "embed_scale", None)
        weight = QuantizedWeight(name, entry, self.ckpt).canonical()
        emb = QuantEmbedding(weight, dtype=self.dtype, device=self.device, scale=scale, prefix=name)
        self._place(name, emb, NONE, entry)

    def _tied_output(self) -> None:
        """A tied output projection over a quantized (or tensor-parallel) embedding becomes its own
        layer over the embedding's tensors; a dense tied one keeps sharing the embedding's weight.
        Where that layer's kernel gives rows back, the embedding looks tokens up in it
        (:class:`TiedEmbedding`) rather than holding the table a second time."""
        cfg = self.full_config
        if not getattr(cfg, "tie_word_embeddings", False):
            return
        out = self.model.get_output_embeddings()
        emb_name = next(
            (n for n, m in self.model.named_modules() if m is self.model.get_input_embeddings()), None
        )
        out_name = next((n for n, m in self.model.named_modules() if m is out), None)
        if out is None or emb_name is None or out_name is None or out_name in self.ckpt.layers:
            return
        entry = self.ckpt.layers.get(emb_name)
        cut = plan(self.model, cfg, self.tp).get(out_name, NONE)
        if entry is None or not (entry.quantized or cut.parallel):
            return
        layer = self.ckpt.linear(
            emb_name,
            device=self.device,
            act_dtype=self.dtype,
            parallel=cut.parallel,
            tp_rank=cut.tp_rank,
            tp_size=cut.tp_size,
            overrides=self.overrides,
        )
        self._place(out_name, layer, cut, entry)
        emb = self.model.get_submodule(emb_name)
        if entry.quantized and not cut.parallel and getattr(layer, "has_row_dequant", False):
            scale = getattr(emb, "embed_scale", None)
            self.model.set_submodule(emb_name, TiedEmbedding(layer, dtype=self.dtype, scale=scale))
            self.report.kernels[emb_name] = f"rows of {out_name} ({kernel_label(layer)})"

    # -- everything else -----------------------------------------------------------------------
    def _source_names(self) -> dict[str, str]:
        """Model parameter name -> checkpoint tensor name, for tensors outside the layers (GGUF
        names mapped as transformers maps them, from the skeleton before any layer was replaced)."""
        index = self.ckpt.index
        if self.ckpt.format != "gguf":
            return {self._renamed(n): n for n in index.names()}
        from ..formats.gguf_arch import hf_tensor_names

        to_hf = hf_tensor_names(self.model, self.ckpt.reader.architecture)
        out: dict[str, str] = {}
        for n in index.names():
            hf = to_hf.get(n)
            if hf is None:
                continue
            if hf in out:
                raise CheckpointError(f"{self.ckpt.path}: tensors {out[hf]!r} and {n!r} both map to {hf}")
            out[hf] = n
        return out

    def _value(self, name: str, src: str, t: torch.Tensor) -> torch.Tensor:
        if self.ckpt.format == "gguf":
            from ..formats.gguf_arch import value_fix

            fix = value_fix(src, self.ckpt.reader.architecture)
            if fix is not None:
                t = fix(t)
        return t

    def _parameters(self) -> None:
        src_of = self._src_of
        out, emb = self.model.get_output_embeddings(), self.model.get_input_embeddings()
        if (
            getattr(self.full_config, "tie_word_embeddings", False)
            and isinstance(out, nn.Linear)
            and isinstance(emb, nn.Embedding)
            and out.weight is not emb.weight
            and out.weight.shape == emb.weight.shape
        ):
            out.weight = emb.weight  # tied: one parameter, filled once from the embedding's tensor
        done: dict[int, nn.Parameter] = {}
        missing: list[str] = []
        for mod_name, module in self.model.named_modules():
            for pname, p in list(module._parameters.items()):
                if p is None:
                    continue
                full = f"{mod_name}.{pname}" if mod_name else pname
                if id(p) in done:
                    module._parameters[pname] = done[id(p)]
                    continue
                if p.device.type != "meta":
                    continue
                src = src_of.get(full)
                if src is None:
                    missing.append(full)
                    continue
                t = self._value(full, src, self._read(src))
                if tuple(t.shape) != tuple(p.shape):
                    raise CheckpointError(
                        f"{self.ckpt.index.where(src)}: expected shape {list(p.shape)} for {full} (from the "
                        f"config), found {list(t.shape)}"
                    )
                if not t.is_floating_point() and p.is_floating_point():
                    raise CheckpointError(
                        f"{self.ckpt.index.where(src)}: expected a float tensor for {full}, found {t.dtype}"
                    )
                new = nn.Parameter(t.to(self.device, p.dtype), requires_grad=False)
                module._parameters[pname] = new
                done[id(p)] = new
        if missing:
            raise CheckpointError(
                f"{self.ckpt.path}: the checkpoint stores no tensor for {len(missing)} parameter(s) of the "
                f"model its config describes: {_names(missing)}"
            )

    def _rotary(self) -> None:
        """llama.cpp stores Llama 3's rope frequency factors as ``rope_freqs`` (theta_i divided by
        factor_i); transformers' own GGUF path drops them. They are applied to every rotary
        embedding's inverse frequencies, as llama.cpp applies them."""
        name = "rope_freqs.weight"
        if self.ckpt.format != "gguf" or name not in self.ckpt.index:
            return
        factors = self._read(name).to(torch.float32).reshape(-1)
        found = False
        for module in self.model.modules():
            for buf in ("inv_freq", "original_inv_freq"):
                inv = getattr(module, buf, None)
                if isinstance(inv, torch.Tensor) and inv.dim() == 1:
                    if inv.numel() != factors.numel():
                        raise CheckpointError(
                            f"{self.ckpt.index.where(name)}: expected {inv.numel()} rope frequency factors "
                            f"(head_dim / 2), found {factors.numel()}"
                        )
                    setattr(module, buf, (inv.to(torch.float32) / factors).to(inv.dtype))
                    found = True
        if not found:
            raise CheckpointError(
                f"{self.ckpt.index.where(name)}: the model has no rotary embedding to apply it to"
            )

    def _buffers(self) -> None:
        for module in self.model.modules():
            for bname, b in list(module._buffers.items()):
                if b is None:
                    continue
                if b.device.type == "meta":
                    raise CheckpointError(f"internal: buffer {bname} of {type(module).__name__} left on meta")
                module._buffers[bname] = b.to(self.device)

    def _unread(self) -> None:
        index = self.ckpt.index
        ignored = dict(self.ckpt.reader.ignored())
        for attn, kv in self.ckpt.kv_cache_scales().items():
            idx = _layer_index(self.model, attn)
            if idx is None:
                for n in kv.names:
                    ignored[n] = (
                        f"KV-cache scale of {attn} ({kv.scheme}): no decoder layer index found for it"
                    )
                continue
            self.report.kv_scales[idx] = kv  # read: quantrt.kv.kv_cache(model) and quantrt run apply them
            self.consumed.update(kv.names)
        if self.report.kv_scales:
            schemes = sorted({str(kv.scheme) for kv in self.report.kv_scales.values()})
            log.info(
                "%s: KV-cache scales of %d layers (%s), applied by a quantized KV cache "
                "(quantrt.kv.kv_cache(model, 'auto'), quantrt run's default); transformers' own cache ignores them",
                self.ckpt.path, len(self.report.kv_scales), ", ".join(schemes),
            )  # fmt: skip
        if self.ckpt.format == "gguf":
            from ..formats.gguf_arch import HARMLESS_EXTRAS

            for n in index.names():
                if n in HARMLESS_EXTRAS:
                    ignored.setdefault(n, HARMLESS_EXTRAS[n])
        if getattr(self.full_config, "tie_word_embeddings", False) and "lm_head.weight" in index:
            out = self.model.get_output_embeddings()
            if out is not None and out.weight is self.model.get_input_embeddings().weight:
                ignored["lm_head.weight"] = "tie_word_embeddings is true: the output layer is the embedding"
        unread = [n for n in index.names() if n not in self.consumed and n not in ignored]
        if unread:
            raise CheckpointError(
                f"{self.ckpt.path}: {len(unread)} stored tensor(s) belong to nothing in the model its "
                f"config describes: {_names(sorted(unread))}"
            )
        for n, why in ignored.items():
            if n in index and n not in self.consumed:
                log.warning("%s: %s not read: %s", self.ckpt.path, n, why)
                self.report.ignored[n] = why


def _bare_weight(module: nn.Module, entry: Any) -> bool:
    """A module that is no linear layer but holds the entry's [N, K] weight as a parameter."""
    w = module._parameters.get("weight")
    return w is not None and tuple(w.shape) == (entry.N, entry.K) and not hasattr(module, "in_features")


def _is_experts(module: nn.Module) -> bool:
    """transformers' experts modules: ``num_experts`` experts stacked in 3-D ``gate_up_proj`` and
    ``down_proj`` parameters, called as ``experts(hidden, top_k_index, top_k_weights)``."""
    gu, dn = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    return (
        isinstance(gu, torch.Tensor)
        and isinstance(dn, torch.Tensor)
        and gu.dim() == 3
        and dn.dim() == 3
        and isinstance(getattr(module, "num_experts", None), int)
    )


def _hidden(module: nn.Module) -> int:
    for attr in ("hidden_dim", "hidden_size"):
        v = getattr(module, attr, None)
        if isinstance(v, int):
            return v
    return int(module.down_proj.shape[1])


def _activation_of(module: nn.Module, config: Any) -> Any:
    """The gated activation an experts module applies: gpt-oss's clamped SwiGLU (its module keeps
    alpha and limit), else the config's ``hidden_act``."""
    from ..moe import Activation, activation_of

    if hasattr(module, "limit") and hasattr(module, "alpha"):
        return Activation("swigluoai", alpha=float(module.alpha), limit=float(module.limit))
    act = getattr(config, "hidden_act", "silu")
    try:
        return activation_of(act)
    except ValueError:
        raise CheckpointError(f"the experts' activation {act!r} is not one quantrt runs") from None


def _device(device: Any, tp: TensorParallel) -> torch.device:
    if device is None:
        if torch.cuda.is_available():
            return torch.device("cuda", tp.rank % torch.cuda.device_count())
        return torch.device("cpu")
    d = torch.device(device)
    if d.type == "cuda" and d.index is None:
        d = torch.device(
            "cuda", torch.cuda.current_device() if tp.world == 1 else tp.rank % torch.cuda.device_count()
        )
    return d


def _tp(tp: Any) -> TensorParallel:
    if tp is None or tp == 1:
        return TensorParallel()
    if isinstance(tp, TensorParallel):
        return tp
    if isinstance(tp, int) and not isinstance(tp, bool) and tp > 1:
        got = TensorParallel.from_process_group()
        if got.world != tp:
            from ..errors import ConfigError

            raise ConfigError(f"tp={tp}, but the default process group has {got.world} ranks")
        return got
    from ..errors import ConfigError

    raise ConfigError(f"tp must be a positive integer or a TensorParallel, found {tp!r}")


def from_pretrained(
    path: str | Path,
    *,
    device: Any = None,
    dtype: torch.dtype | str | None = None,
    tp: int | TensorParallel | None = None,
    overrides: Any = None,
    progress: bool | None = None,
    quantization: str | None = None,
    quantize: Any = None,
) -> nn.Module:
    """A ready transformers model (``PreTrainedModel``: ``generate`` works) from a checkpoint folder
    (any format quantrt reads; sharded or not) or a ``.gguf`` file, with quantrt's layers.

    ``device``: where it runs (default: the GPU if there is one). ``dtype``: activations and the
    unquantized tensors (default: the checkpoint's own, bfloat16 for GGUF). ``tp``: tensor
    parallelism, a rank count with torch.distributed initialised or a :class:`TensorParallel`
    (quantrt runs the all-reduce and all-gather). ``overrides``: dispatch overrides (default:
    the QUANTRT_* environment). ``quantize``: quantize a dense checkpoint's linear layers at load,
    one at a time on ``device``: a catalog scheme name, or a
    :class:`~quantrt.formats.online.OnlineQuantization` with per-layer overrides and the layers kept
    dense (default: the output head and MoE routers). ``quantization``: vLLM's online methods
    (``"experts_int8"``). ``model.quantrt`` holds the :class:`LoadReport`.
    """
    from ..checkpoint import open_checkpoint
    from .config import model_config

    par = _tp(tp)
    dev = _device(device, par)
    if quantize is not None:
        from ..formats.online import online_quantization

        if quantization is not None:
            from ..errors import ConfigError

            raise ConfigError(f"quantize={quantize!r} and quantization={quantization!r}: give one of them")
        quantization = online_quantization(quantize)
    ckpt = open_checkpoint(path, quantization=quantization)
    config = model_config(ckpt)
    act = _dtype(dtype, ckpt)
    config._name_or_path = str(path)
    model = build_empty(local_config(config, par), act)
    try:
        report = ModelLoader(
            model,
            ckpt,
            device=dev,
            dtype=act,
            tp=par,
            full_config=config,
            overrides=overrides,
            progress=progress,
        ).run()
    except BaseException as err:
        del model
        gc.collect()
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        raise err.with_traceback(None) from None
    model.quantrt = report
    model.eval()
    return model


def _dtype(dtype: torch.dtype | str | None, ckpt: Any) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    names = {
        "bf16": torch.bfloat16,
        "bfloat16": torch.bfloat16,
        "fp16": torch.float16,
        "float16": torch.float16,
        "fp32": torch.float32,
        "float32": torch.float32,
    }
    if isinstance(dtype, str):
        if dtype not in names:
            from ..errors import ConfigError

            raise ConfigError(f"dtype {dtype!r}: expected one of {', '.join(names)}")
        return names[dtype]
    if ckpt.format == "gguf":
        return torch.bfloat16
    return ckpt.default_act_dtype
