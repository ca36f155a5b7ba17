"""The modules quantrt puts into a transformers model beside its QuantLinear layers.

* :class:`QuantEmbedding`: a quantized embedding table (GGUF stores ``token_embd`` in Q8_0, Q4_K
  ...) looked up by token id: only the rows asked for are dequantized, so the table stays at its
  stored size instead of a dense copy (262144 x 640 in bf16 is 335 MB; in Q8_0, 178 MB).
* :class:`TiedEmbedding`: the same table read through the tied output layer's kernel state, so a
  model whose lm_head is its embedding holds the table once.
* :class:`RowParallel` and :class:`GatherColumns`: the collective after a row-parallel layer (sum
  of the ranks' partial outputs) and after a column-parallel one whose caller needs every column
  (the output projection), through ``torch.distributed`` on the process group given.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..canonical import CanonicalWeight, canonical_specs
from ..errors import CheckpointError


class QuantEmbedding(nn.Module):
    """An embedding table kept quantized; ``forward(ids)`` dequantizes the rows of those ids.

    ``scale`` reproduces an embedding module that multiplies its output (Gemma 3's
    ``Gemma3TextScaledWordEmbedding``: ``embedding(ids) * embed_scale.to(dtype)``).
    """

    def __init__(
        self,
        weight: CanonicalWeight,
        *,
        dtype: torch.dtype,
        device: Any = "cpu",
        scale: torch.Tensor | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        specs = canonical_specs(weight.scheme, weight.N, weight.K)
        self.num_embeddings, self.embedding_dim = weight.N, weight.K
        self.scheme, self.dtype, self.prefix = weight.scheme, dtype, prefix
        self._names, self._row_tensors = list(weight.tensors), set()
        for name, t in weight.tensors.items():
            spec = specs.get(name)
            by_row = spec is not None and spec.output_dim == 0 and t.dim() >= 1 and t.shape[0] == weight.N
            if not by_row and spec is not None and spec.output_dim is not None:
                raise CheckpointError(
                    f"{prefix or 'embedding'}: {weight.scheme} stores {name!r} {list(t.shape)}, which is not "
                    f"one entry per row, so it cannot be looked up by token id"
                )
            self.register_buffer(name, t.to(device), persistent=False)
            if by_row:
                self._row_tensors.add(name)
        self.register_buffer(
            "scale", None if scale is None else scale.detach().to(device, torch.float32), persistent=False
        )

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        from ..reference import dequantize

        ids = input_ids.reshape(-1)
        tensors = {
            name: getattr(self, name).index_select(0, ids)
            if name in self._row_tensors
            else getattr(self, name)
            for name in self._names
        }
        rows = dequantize(CanonicalWeight(self.scheme, ids.numel(), self.embedding_dim, tensors))
        out = rows.to(self.dtype)
        if self.scale is not None:
            out = out * self.scale.to(self.dtype)
        return out.reshape(*input_ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, scheme={self.scheme}"


class TiedEmbedding(nn.Module):
    """The embedding of a model whose output layer is tied to it, looked up in that layer's prepared
    weight (``QuantLinear.dequant_rows``): the table is held once, in the kernel's layout."""

    def __init__(self, output: nn.Module, *, dtype: torch.dtype, scale: torch.Tensor | None = None) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = output.out_features, output.in_features
        self.dtype, self.scheme = dtype, output.scheme
        self._output = [output]  # not a submodule: the output layer is registered where it runs
        dev = output.device
        self.register_buffer(
            "scale", None if scale is None else scale.detach().to(dev, torch.float32), persistent=False
        )

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        layer = self._output[0]
        ids = input_ids.reshape(-1).tolist()
        out = torch.empty(len(ids), self.embedding_dim, dtype=self.dtype, device=layer.device)
        for i, t in enumerate(ids):
            if not 0 <= t < self.num_embeddings:
                raise IndexError(f"token id {t} is outside the vocabulary of {self.num_embeddings}")
            out[i] = layer.dequant_rows(t, t + 1)[0]
        if self.scale is not None:
            out = out * self.scale.to(self.dtype)
        return out.reshape(*input_ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, scheme={self.scheme}, tied to the output layer"


class RowParallel(nn.Module):
    """A row-parallel layer (this rank holds K/tp inputs) followed by the sum over the ranks."""

    def __init__(self, layer: nn.Module, group: Any) -> None:
        super().__init__()
        self.layer, self.group = layer, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        y = self.layer(x)
        dist.all_reduce(y, group=self.group)
        return y


class GatherColumns(nn.Module):
    """A column-parallel layer whose caller needs every output column: the ranks' parts are
    gathered along the last dimension (in rank order, which is the column order)."""

    def __init__(self, layer: nn.Module, group: Any, world: int) -> None:
        super().__init__()
        self.layer, self.group, self.world = layer, group, world

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        y = self.layer(x).contiguous()
        parts = [torch.empty_like(y) for _ in range(self.world)]
        dist.all_gather(parts, y, group=self.group)
        return torch.cat(parts, dim=-1)
