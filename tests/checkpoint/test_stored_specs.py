"""Format adapters state their stored layouts as changes to the canonical ones (``stored_specs``)."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from quantrt.canonical import canonical_specs
from quantrt.formats.base import Stored, stored_specs
from quantrt.formats.compressed_tensors import CTPackedAdapter
from quantrt.formats.fp4 import MXFP4Adapter
from quantrt.formats.gptq import GPTQAdapter
from quantrt.schemes import parse_scheme


def test_gptq_3bit_words_and_zeros_packed_along_n() -> None:
    N, K = 40, 256
    specs = GPTQAdapter(3, zero_offset=1).tensor_specs(parse_scheme("w3a16-int-g32-sym"), N, K)
    assert list(specs) == [
        "qweight",
        "qzeros",
        "scales",
        "g_idx",
    ]  # zeros and g_idx although sym, no act-order
    q, z = specs["qweight"], specs["qzeros"]
    assert (q.shape, q.dtype, q.input_dim, q.output_dim) == ((24, N), torch.int32, 0, 1)
    assert (q.input_unit, q.input_align) == (Fraction(32, 3), 32)  # 32 codes in 3 words
    assert (z.shape, z.output_unit, z.output_align, z.input_unit) == ((8, 4), Fraction(32, 3), 32, 32)
    assert specs["scales"].shape == (8, N) and specs["scales"].dtype == torch.float16


def test_entries_follow_the_canonical_tensors_of_the_scheme() -> None:
    adapter = CTPackedAdapter()
    sym = adapter.tensor_specs(parse_scheme("w4a16-int-g128-sym"), 64, 256)
    asym = adapter.tensor_specs(parse_scheme("w4a16-int-g128-asym-actorder"), 64, 256)
    assert list(sym) == ["weight_packed", "weight_scale"]
    assert list(asym) == ["weight_packed", "weight_scale", "weight_zero_point", "weight_g_idx"]
    assert asym["weight_zero_point"].shape == (8, 2) and asym["weight_zero_point"].row == "replicate"


def test_reshape_scales_the_unit_of_the_dim_it_changes() -> None:
    w = MXFP4Adapter("blocks", "scales", blocks_3d=True).tensor_specs(parse_scheme("w4a16-mxfp4"), 8, 128)
    assert w["blocks"].shape == (8, 4, 16) and w["blocks"].input_unit == 32 and w["blocks"].input_align == 32


def test_a_canonical_tensor_left_unstated_is_refused() -> None:
    scheme = parse_scheme("w4a16-int-g128-asym")
    canonical = canonical_specs(scheme, 64, 256)
    layout = {"q": Stored("qweight"), "s": Stored("scales")}
    with pytest.raises(AssertionError, match="zeros"):
        stored_specs(canonical, 64, 256, layout)
    assert list(stored_specs(canonical, 64, 256, layout, drop=("zeros",))) == ["q", "s"]
