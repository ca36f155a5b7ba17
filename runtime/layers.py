"""One quantized linear layer for every format and every kernel.

:class:`QuantLinear` is what an engine drives (vLLM's LinearMethod shape, as an ``nn.Module``):
``create_weights`` makes parameters in checkpoint layout that carry their TensorSpecs and a
``weight_loader``; ``load`` fills them (only this rank's part; fused layers slice by slice);
``process_weights_after_loading`` converts to canonical tensors, lets dispatch pick the kernel
and runs its one-time ``prepare``; ``forward`` runs it. What differs per format is data (the
adapter), what differs per hardware is the kernel.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from .canonical import PER_LAYER_ACTIVATION_SCALES, CanonicalAdapter, CanonicalWeight
from .dispatch import Selection, build, device_of, torch_device_of
from .env import Overrides
from .errors import ShardError
from .kernels import Kernel
from .schemes import Scheme, parse_scheme
from .specs import LayerSpec, TensorSpec


def _fill(param: nn.Parameter, part: torch.Tensor) -> None:
    """``param <- part``: adopts ``part``'s storage when it is exactly the parameter's tensor (a
    whole, contiguous, freshly read tensor), so a large layer is not held twice while it loads."""
    same = (
        part.shape == param.shape
        and part.dtype == param.dtype
        and part.device == param.device
        and part.is_contiguous()
        and part.untyped_storage().nbytes() == part.numel() * part.element_size()
    )
    if same:
        param.data = part
    else:
        param.data.copy_(part)


def _bind_loader(layer: QuantLinear, name: str) -> Any:
    """vLLM's ``param.weight_loader(param, tensor, shard_id)`` for parameter ``name`` of ``layer``."""

    def weight_loader(param: nn.Parameter, loaded: torch.Tensor, shard_id: int | str | None = None) -> None:
        layer.load(name, loaded, shard_id)

    return weight_loader


def _as_dtype(t: torch.Tensor, dtype: torch.dtype, where: str) -> torch.Tensor:
    """``t`` in the parameter's dtype: floats widen or narrow to 16/32 bits; int64 (a ``g_idx``
    or packed words, which readers accept beside int32) becomes int32 only when every value
    fits, checked before the cast so that 2^32 + 1 is refused rather than wrapped to 1."""
    if t.dtype == dtype:
        return t
    if (
        t.dtype.is_floating_point
        and dtype.is_floating_point
        and t.dtype.itemsize <= 4
        and dtype.itemsize >= 2
    ):
        return t.to(dtype)
    if t.dtype == torch.int64 and dtype == torch.int32:
        info = torch.iinfo(dtype)
        if t.numel() and (int(t.min()) < info.min or int(t.max()) > info.max):
            raise ShardError(
                f"{where}: expected int64 values that fit int32 [{info.min}, {info.max}], found "
                f"[{int(t.min())}, {int(t.max())}]"
            )
        return t.to(dtype)
    raise ShardError(
        f"{where}: expected dtype {str(dtype).replace('torch.', '')}, "
        f"found {str(t.dtype).replace('torch.', '')}"
    )


class QuantLinear(nn.Module):
    """A quantized linear layer whose kernel dispatch chose, on one tensor-parallel rank.

    ``parallel``: None, ``"column"`` (this rank holds N/tp_size outputs; ranks' outputs
    concatenate) or ``"row"`` (K/tp_size inputs; ranks' outputs sum; the bias is added on
    rank 0 only so the sum carries it once). ``output_sizes`` makes a fused layer (q, k, v)
    whose slices load separately, named by ``shard_names``. ``adapter`` is the format's (how the
    checkpoint stores the tensors; canonical tensors when None).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        scheme: Scheme | str,
        *,
        bias: bool = False,
        output_sizes: Sequence[int] | None = None,
        shard_names: Sequence[str] | None = None,
        parallel: str | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
        act_dtype: torch.dtype = torch.bfloat16,
        out_dtype: torch.dtype | None = None,
        device: Any = "cpu",
        adapter: Any = None,
        prefix: str = "",
        m_hint: int | None = None,
    ) -> None:
        super().__init__()
        if parallel not in (None, "column", "row"):
            raise ValueError(f"parallel must be None, 'column' or 'row', found {parallel!r}")
        if not 0 <= tp_rank < tp_size:
            raise ValueError(f"tp_rank={tp_rank} is not in [0, {tp_size})")
        if tp_size > 1 and parallel is None:
            raise ValueError("tp_size > 1 needs parallel='column' or 'row'")
        self.in_features, self.out_features = in_features, out_features
        self.output_sizes = tuple(output_sizes) if output_sizes else (out_features,)
        if sum(self.output_sizes) != out_features:
            raise ValueError(f"output_sizes {self.output_sizes} do not add up to out_features={out_features}")
        self.shard_names = tuple(shard_names) if shard_names else ()
        if self.shard_names and len(self.shard_names) != len(self.output_sizes):
            raise ValueError(f"{len(self.shard_names)} shard names for {len(self.output_sizes)} slices")
        self.parallel, self.tp_rank, self.tp_size = parallel, tp_rank, tp_size
        self.act_dtype, self.out_dtype = act_dtype, out_dtype
        #: where the tensors live, and the device dispatch plans for (a device kind's own name, such as
        #: ``rocm:0`` or an installed kind's ``acme:0``, where torch calls it something else)
        self.device, self.plan_device = torch_device_of(device), device_of(device)
        self.prefix, self.m_hint, self.has_bias = prefix, m_hint, bias
        if parallel == "column" and any(n % tp_size for n in self.output_sizes):
            raise ShardError(
                f"{prefix or 'layer'}: output sizes {self.output_sizes} do not divide by {tp_size} ranks"
            )
        if parallel == "row" and in_features % tp_size:
            raise ShardError(
                f"{prefix or 'layer'}: in_features={in_features} does not divide by {tp_size} ranks"
            )
        col = parallel == "column" and tp_size > 1
        row = parallel == "row" and tp_size > 1
        self.K_part = in_features // tp_size if row else in_features
        self.output_sizes_part = tuple(n // tp_size for n in self.output_sizes) if col else self.output_sizes
        self.N_part = sum(self.output_sizes_part)
        self._loaded: dict[str, set[int]] = {}
        self._kernel: Kernel | None = None
        self._state: Any = None
        self.selection: Selection | None = None
        self.scheme = parse_scheme(scheme) if isinstance(scheme, str) else scheme
        self.adapter = adapter or CanonicalAdapter()
        self.create_weights()

    # -- loading ---------------------------------------------------------------------------
    def create_weights(self) -> None:
        """Register this rank's parameters in the adapter's layout, each carrying its full TensorSpec."""
        full = self.adapter.tensor_specs(
            self.scheme, self.out_features, self.in_features, len(self.output_sizes)
        )
        self.tensor_specs = full
        for name, spec in full.items():
            data = torch.empty(self._local_shape(name, spec), dtype=spec.dtype, device=self.device)
            param = nn.Parameter(data, requires_grad=False)
            param.spec = spec  # type: ignore[attr-defined]
            param.weight_loader = _bind_loader(self, name)  # type: ignore[attr-defined]
            self.register_parameter(name, param)
        if self.has_bias:
            bias = nn.Parameter(
                torch.empty(self.N_part, dtype=self.act_dtype, device=self.device), requires_grad=False
            )
            bias.spec = TensorSpec(  # type: ignore[attr-defined]
                "bias", (self.out_features,), self.act_dtype, output_dim=0, row="replicate"
            )
            bias.weight_loader = _bind_loader(self, "bias")  # type: ignore[attr-defined]
            self.register_parameter("bias", bias)
        else:
            self.register_parameter("bias", None)

    def _slice_specs(self, name: str) -> list[TensorSpec]:
        """The full TensorSpec of ``name`` for each slice of a fused layer, as if it stood alone."""
        return [
            self.adapter.tensor_specs(self.scheme, n, self.in_features, 1)[name] for n in self.output_sizes
        ]

    def _local_shape(self, name: str, spec: TensorSpec) -> tuple[int, ...]:
        S = len(self.output_sizes)
        if S == 1 or spec.per_slice:
            return spec.local_shape(
                self.parallel, self.tp_rank, self.tp_size, self.in_features, self.out_features
            )
        shapes = [
            sp.local_shape(self.parallel, self.tp_rank, self.tp_size, self.in_features, n)
            for sp, n in zip(self._slice_specs(name), self.output_sizes)
        ]
        if spec.output_dim is None:
            return shapes[0]
        out = list(shapes[0])
        out[spec.output_dim] = sum(s[spec.output_dim] for s in shapes)
        return tuple(out)

    def shard_index(self, shard: int | str) -> int:
        if isinstance(shard, int):
            if not 0 <= shard < len(self.output_sizes):
                raise ShardError(
                    f"{self.prefix or 'layer'}: shard {shard} is out of range for "
                    f"{len(self.output_sizes)} slices"
                )
            return shard
        if shard not in self.shard_names:
            raise ShardError(
                f"{self.prefix or 'layer'}: unknown shard {shard!r}; known: {list(self.shard_names)}"
            )
        return self.shard_names.index(shard)

    def shard_label(self, i: int) -> str:
        return self.shard_names[i] if self.shard_names else str(i)

    def load(self, name: str, tensor: torch.Tensor, shard: int | str | None = None) -> None:
        """Fill parameter ``name`` from a full (unsharded) checkpoint tensor; this rank's part is taken.

        ``shard`` names the slice of a fused layer the tensor belongs to (an index, or a
        name from ``shard_names``); None loads a tensor that covers the whole layer.
        """
        if name == "bias":
            return self.load_bias(tensor, shard)
        if name not in self.tensor_specs:
            raise ShardError(
                f"{self.prefix}: unexpected tensor {name!r}; this layer ({self.scheme}) "
                f"stores {sorted(self.tensor_specs)}"
            )
        param: nn.Parameter = getattr(self, name)
        spec = self.tensor_specs[name]
        where = f"{self.prefix}.{name}" if self.prefix else name
        tensor = _as_dtype(tensor, spec.dtype, where)
        if spec.per_slice and shard is None and tensor.numel() == spec.shape[0] and tensor.dim() != 1:
            tensor = tensor.reshape(spec.shape)  # per-tensor scales stored as [] or [1, 1] by some tools
        if shard is None:
            if len(self.output_sizes) == 1:
                part = spec.shard(
                    tensor, self.parallel, self.tp_rank, self.tp_size, self.in_features, self.out_features
                )
                _fill(param, part)
                self._loaded.setdefault(name, set()).add(0)
                return
            return self._load_fused_whole(name, tensor)
        self._load_slice(name, tensor, self.shard_index(shard))

    def load_canonical(
        self, weight: CanonicalWeight, shard: int | str | None = None, bias: torch.Tensor | None = None
    ) -> None:
        """Load every canonical tensor of ``weight`` (one slice, or the whole layer)."""
        for name, t in weight.tensors.items():
            if name in PER_LAYER_ACTIVATION_SCALES and shard is None and len(self.output_sizes) > 1:
                t = t.reshape(-1)[:1]
            self.load(name, t, shard)
        if bias is not None:
            self.load("bias", bias, shard)

    def _load_fused_whole(self, name: str, tensor: torch.Tensor) -> None:
        """One tensor covering every slice of a fused layer, loaded slice by slice."""
        spec = self.tensor_specs[name]
        if spec.per_slice:
            if tensor.numel() == 1:
                tensor = tensor.reshape(1).expand(len(self.output_sizes)).clone()
            spec.check_shape(tensor)
            for i in range(len(self.output_sizes)):
                self._load_slice(name, tensor[i : i + 1], i)
            return
        spec.check_shape(tensor, f"{self.prefix}.{name}")
        if spec.output_dim is None:
            for i in range(len(self.output_sizes)):
                self._load_slice(name, tensor, i)
            return
        start = 0
        for i, n in enumerate(self.output_sizes):
            lo, hi = spec.index_range(spec.output_dim, start, start + n, self.out_features)
            self._load_slice(name, tensor.narrow(spec.output_dim, lo, hi - lo), i)
            start += n

    def _load_slice(self, name: str, tensor: torch.Tensor, idx: int) -> None:
        param: nn.Parameter = getattr(self, name)
        full = self.tensor_specs[name]
        where = f"{self.prefix}.{name}[slice {idx}]"
        if full.per_slice:
            if tensor.numel() != 1:
                raise ShardError(f"{where}: expected one value per slice, found shape {list(tensor.shape)}")
            param.data[idx] = tensor.reshape(())
            self._loaded.setdefault(name, set()).add(idx)
            return
        slice_specs = self._slice_specs(name)
        sspec = slice_specs[idx]
        sspec.check_shape(tensor, where)
        n = self.output_sizes[idx]
        part = sspec.shard(tensor, self.parallel, self.tp_rank, self.tp_size, self.in_features, n)
        if full.output_dim is None:  # replicated along N: every slice must agree
            if self._loaded.get(name) and not torch.equal(param.data, part.to(param.device)):
                raise ShardError(
                    f"{where}: differs from the value another slice loaded; fused slices "
                    f"must share it to share one kernel"
                )
            param.data.copy_(part)
        else:
            d = full.output_dim
            sizes = [
                sp.local_shape(self.parallel, self.tp_rank, self.tp_size, self.in_features, m)[d]
                for sp, m in zip(slice_specs, self.output_sizes)
            ]
            offset = sum(sizes[:idx])
            S = len(self.output_sizes)
            local = self.adapter.tensor_specs(self.scheme, self.N_part, self.K_part, S)[name]
            p_start = sum(self.output_sizes_part[:idx])
            lo, _ = local.index_range(d, p_start, p_start + self.output_sizes_part[idx], self.N_part)
            if lo != offset:
                raise ShardError(
                    f"{where}: fused slices do not line up in this layout (slice starts at "
                    f"stored index {offset}, the fused layout needs {lo})"
                )
            param.data.narrow(d, offset, sizes[idx]).copy_(part)
        self._loaded.setdefault(name, set()).add(idx)

    def load_bias(self, tensor: torch.Tensor, shard: int | str | None = None) -> None:
        """Fill the bias from a full one (``shard`` None) or one slice's (rank 0 adds it under row split)."""
        if self.bias is None:
            raise ShardError(f"{self.prefix}: a bias was loaded but the layer was built with bias=False")
        spec: TensorSpec = self.bias.spec  # type: ignore[attr-defined]
        tensor = tensor.to(self.act_dtype)
        if shard is None:
            part = spec.shard(
                tensor, self.parallel, self.tp_rank, self.tp_size, self.in_features, self.out_features
            )
            self.bias.data.copy_(part)
            self._loaded["bias"] = set(range(len(self.output_sizes)))
            return
        idx = self.shard_index(shard)
        n = self.output_sizes[idx]
        if tuple(tensor.shape) != (n,):
            raise ShardError(
                f"{self.prefix}.bias[slice {idx}]: expected shape [{n}], found {list(tensor.shape)}"
            )
        sub = TensorSpec("bias", (n,), self.act_dtype, output_dim=0, row="replicate")
        part = sub.shard(tensor, self.parallel, self.tp_rank, self.tp_size, self.in_features, n)
        off = sum(self.output_sizes_part[:idx])
        self.bias.data[off : off + part.shape[0]].copy_(part)
        self._loaded.setdefault("bias", set()).add(idx)

    def process_weights_after_loading(self, overrides: Overrides | None = None) -> QuantLinear:
        """Check everything arrived, convert to canonical, pick the kernel, prepare it."""
        self.attach(self.canonical(), overrides)
        return self

    def canonical(self) -> CanonicalWeight:
        """This rank's part in canonical tensors, once every tensor (and slice) has arrived."""
        S = len(self.output_sizes)
        for name in [*self.tensor_specs, *(["bias"] if self.has_bias else [])]:
            got = self._loaded.get(name, set())
            spec = self.tensor_specs.get(name)
            need = (
                set(range(S))
                if spec is None or spec.per_slice or spec.output_dim is not None
                else {min(got, default=0)}
            )
            if not got:
                raise ShardError(f"{self.prefix or 'layer'}: tensor {name!r} was never loaded")
            if need - got:
                missing = ", ".join(self.shard_label(i) for i in sorted(need - got))
                raise ShardError(f"{self.prefix or 'layer'}: tensor {name!r} is missing slice(s) {missing}")
        tensors = {name: getattr(self, name).data for name in self.tensor_specs}
        return self.adapter.to_canonical(
            tensors, self.scheme, self.N_part, self.K_part, self.output_sizes_part
        )

    def attach(self, weight: CanonicalWeight, overrides: Overrides | None = None) -> None:
        """Dispatch on the canonical weight, prepare the kernel and drop the loading parameters."""
        spec = self.layer_spec()
        kernel, sel = build(spec, self.plan_device, overrides)
        state = kernel.prepare(weight.to(self.device), spec)
        self._kernel, self._state, self.selection = kernel, state, sel
        for name in list(self.tensor_specs):
            delattr(self, name)
        self._bias = None
        if self.bias is not None and not (self.parallel == "row" and self.tp_rank > 0):
            self._bias = self.bias.data

    def layer_spec(self) -> LayerSpec:
        return LayerSpec(
            self.scheme,
            self.in_features,
            self.out_features,
            self.K_part,
            self.N_part,
            act_dtype=self.act_dtype,
            out_dtype=self.out_dtype,
            bias=self.has_bias,
            m_hint=self.m_hint,
            output_sizes=self.output_sizes_part,
            parallel=self.parallel,
            tp_size=self.tp_size,
        )

    # -- running ---------------------------------------------------------------------------
    @property
    def has_row_dequant(self) -> bool:
        """Whether the kernel can give back rows of the weight exactly (``dequant_rows``), so a tied
        embedding can look tokens up in this layer's prepared state instead of a second copy."""
        return self._state is not None and self._state.rows is not None

    def dequant_rows(self, n0: int, n1: int) -> torch.Tensor:
        """Rows [n0, n1) of this rank's weight, dequantized from the prepared state."""
        if not self.has_row_dequant:
            raise RuntimeError(f"{self.prefix or 'layer'}: kernel {self.kernel_name} keeps no row access")
        return self._state.dequant_rows(n0, n1)

    @property
    def kernel_name(self) -> str:
        if self._kernel is None:
            raise RuntimeError(
                f"{self.prefix or 'layer'}: weights are not processed yet "
                "(call process_weights_after_loading)"
            )
        return self._kernel.name

    def forward(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        if x.dim() == 2:  # [tokens, K] as it comes: no reshape and view back (host time per call)
            return self._state(x, self._bias, out)
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1])
        if x2.shape[0] == 0:
            return x.new_empty(*lead, self.N_part, dtype=self.out_dtype or x.dtype)
        y = self._state(x2, self._bias, None if out is None else out.view(-1, self.N_part))
        return y.view(*lead, self.N_part)

    def extra_repr(self) -> str:
        kern = self._kernel.name if self._kernel is not None else "not prepared"
        tp = f", {self.parallel} rank {self.tp_rank}/{self.tp_size}" if self.tp_size > 1 else ""
        return f"{self.in_features}, {self.out_features}, scheme={self.scheme}, kernel={kern}{tp}"

    # -- convenience -----------------------------------------------------------------------
    @classmethod
    def from_canonical(
        cls,
        weight: CanonicalWeight,
        *,
        bias: torch.Tensor | None = None,
        device: Any = "cpu",
        act_dtype: torch.dtype = torch.bfloat16,
        overrides: Overrides | None = None,
        **kw: Any,
    ) -> QuantLinear:
        """A ready layer from canonical tensors (e.g. from :func:`quantrt.reference.quantize`)."""
        layer = cls(
            weight.K,
            weight.N,
            weight.scheme,
            bias=bias is not None,
            output_sizes=weight.output_sizes if len(weight.output_sizes) > 1 else None,
            act_dtype=act_dtype,
            device=device,
            **kw,
        )
        layer.load_canonical(weight, bias=bias)
        return layer.process_weights_after_loading(overrides)


def load_slices(layer: QuantLinear, slices: Mapping[int | str, CanonicalWeight]) -> QuantLinear:
    """Load a fused layer from one canonical weight per slice, then process it."""
    for shard, w in slices.items():
        layer.load_canonical(w, shard)
    return layer.process_weights_after_loading()


class SlicedLinear(nn.Module):
    """A fused layer whose slices differ in scheme: one layer (and kernel) per run of equal schemes.

    DESIGN's rule for mixed fused layers (GGUF Q4_K_M stores v_proj as Q6_K beside Q4_K q/k):
    each slice gets its own kernel and the outputs concatenate, under tensor parallelism too
    (every part is split the same way, so a rank's output holds its part of every slice).
    """

    def __init__(self, parts: Sequence[nn.Module]) -> None:
        super().__init__()
        self.parts = nn.ModuleList(parts)

    @property
    def kernel_names(self) -> list[str]:
        return [getattr(p, "kernel_name", "torch F.linear") for p in self.parts]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p(x) for p in self.parts], dim=-1)
