"""torch.compile(fullgraph=True) over the native CPU kernels (eager and inductor backends).

The kernels call C code through ``ctypes`` with raw data pointers; torch.compile cannot trace that
(with fullgraph it refuses, without it the graph break freed the GGUF workspace before the C code
wrote it: heap corruption). Under compile every prepared layer runs as the one ``quantrt::linear`` op
(runtime/prepared.py), whose implementation runs the eager strategy, and exact rows as
``quantrt::rows``. Checked here: a module of QuantLinear layers of several families compiles into one
graph, gives the eager output, and stays within DESIGN.md's bound of the fp32 reference; the AMX
kernels' dequantize-then-matmul strategy and GGUF's exact rows traced; the op's schema and fake
against its real implementation on every native layout (``torch.library.opcheck``); and eager calls
never enter the op layer (their host cost stays the direct ``ctypes`` call's).
"""

from __future__ import annotations

import functools
import zlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from quantrt import prepared as prepared_module
from quantrt import reference
from quantrt.backends.cpu import amx, dense_native, gguf_native, lut_native, wint_native
from quantrt.backends.cpu.native import build
from quantrt.canonical import CanonicalWeight
from quantrt.layers import QuantLinear
from quantrt.specs import LayerSpec

OK, WHY = build.status()
pytestmark = pytest.mark.skipif(not OK, reason=f"native CPU kernels cannot be built here: {WHY}")

#: the int8/fp8 activation quantization of GGUF and W8A8 kernels: DESIGN.md's error metric bound
DESIGN = 2e-2
#: (scheme, N) of the layers beside the GGUF MLP, all on the same K; one per native family
SIDE = (
    ("w4a16-int-g128-asym", 40),  # cpu.native_wint
    ("w8a8-int-ch-sym", 24),  # cpu.native_w8a8_int8
    ("w4a16-nf4-g64", 33),  # cpu.native_lut
    ("w8a8-fp8-ch", 17),  # cpu.native_lut with fp8 activations (traced torch ops before the op)
)


def gen(*case: object) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(repr(case).encode()))


Ref = tuple[CanonicalWeight, torch.Tensor]  # what the reference needs of a layer: weight and bias


def quantized(scheme: str, N: int, K: int, g: torch.Generator) -> tuple[QuantLinear, Ref]:
    cw = reference.quantize(torch.randn(N, K, generator=g) * 0.1, scheme)
    bias = torch.randn(N, generator=g) * 0.1
    lin = QuantLinear.from_canonical(cw, bias=bias, act_dtype=torch.float32)
    assert lin.kernel_name.startswith(("cpu.native", "cpu.amx")), (scheme, lin.kernel_name)
    return lin, (cw, bias)


def ref(r: Ref, v: torch.Tensor) -> torch.Tensor:
    return reference.linear(v, r[0], r[1], out_dtype=torch.float32)


class Mixed(nn.Module):
    """A GGUF MLP (Q4_K gate, Q6_K up, Q8_0 down) beside a layer of every other native family and a
    dense bf16 layer, concatenated: one graph holding every kind of native op."""

    def __init__(self, K: int, H: int, g: torch.Generator) -> None:
        super().__init__()
        self.gate, self.gate_ref = quantized("gguf-q4_k", H, K, g)
        self.up, self.up_ref = quantized("gguf-q6_k", H, K, g)
        self.down, self.down_ref = quantized("gguf-q8_0", K, H, g)
        pairs = [quantized(s, n, K, g) for s, n in SIDE]
        self.side = nn.ModuleList(p[0] for p in pairs)
        self.side_refs = [p[1] for p in pairs]
        self.dense_w = (torch.randn(29, K, generator=g) * 0.1).to(torch.bfloat16)
        self.dense = dense_native.DenseLinear(self.dense_w, None, torch.float32)
        assert self.dense.strategy(1).startswith("native"), self.dense.reason

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.down(F.silu(self.gate(x)) * self.up(x))
        return torch.cat([h, *(lin(x) for lin in self.side), self.dense(x)], dim=-1)

    def reference(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The fp32 reference of each part of the output (the MLP chained through the reference)."""
        h = ref(self.down_ref, F.silu(ref(self.gate_ref, x)) * ref(self.up_ref, x))
        return [h, *(ref(r, x) for r in self.side_refs), x @ self.dense_w.float().T]


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref.double()).norm() / ref.double().norm())


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_fullgraph_compile_matches_eager_and_the_reference(backend: str) -> None:
    torch._dynamo.reset()
    g = gen("mixed", backend)
    K, H = 256, 160  # side N = 40, 33, 17, 29: ragged 16-row groups
    model = Mixed(K, H, g)
    compiled = torch.compile(model, backend=backend, fullgraph=True, dynamic=True)
    widths = [K, *(n for _, n in SIDE), 29]
    for M in (3, 7, 1):  # GEMM with a symbolic M (one graph), then the M=1 GEMV graph
        x = torch.randn(M, K, generator=g)
        want = model(x)
        got = compiled(x)
        assert got.shape == want.shape == (M, sum(widths))
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        for i, (part, ref) in enumerate(zip(got.split(widths, dim=-1), model.reference(x), strict=True)):
            assert rel(part, ref) < DESIGN, (
                f"{backend} M={M} part {i}: {rel(part, ref):.3g} from the reference"
            )


def test_amx_paths_and_row_dequant_compile() -> None:
    """cpu.amx_*'s dequantize-then-matmul strategy (forced here from M=2, in slices of 16 rows) and
    GGUF's exact rows traced: the compiled call gives the eager one's numbers."""
    torch._dynamo.reset()
    g = gen("amx")
    K = 256
    cases = [
        (amx.AmxGGUF, "gguf-q4_k", 37),
        (amx.AmxWint, "w4a16-int-g64-sym", 40),
        (amx.AmxLut, "w4a16-nf4-g64", 33),
    ]
    for cls, scheme, N in cases:
        cw = reference.quantize(torch.randn(N, K, generator=g) * 0.1, scheme)
        spec = LayerSpec(cw.scheme, K, N, act_dtype=torch.float32, out_dtype=torch.float32)
        kernel = cls()
        layout = kernel.prepare(cw, spec).layout
        state = kernel.prepared(layout, kernel.strategies(layout, tiles=False, from_m=2, rows=16), spec)
        assert state.strategy(5).name.startswith("amx: dequant bf16 slices of 16 rows")
        bias = torch.randn(N, generator=g)
        x = torch.randn(5, K, generator=g)
        fn = torch.compile(lambda v, b, s=state: s(v, b), backend="eager", fullgraph=True)
        got, want = fn(x, bias), state(x, bias)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        ref = reference.linear(x, cw, bias, out_dtype=torch.float32)
        assert rel(got, ref) < DESIGN, f"{cls.name}: {rel(got, ref):.3g} from the reference"
    cw = reference.quantize(torch.randn(35, K, generator=g), "gguf-q6_k")
    for cls in (gguf_native.CpuNativeGGUF, amx.AmxGGUF):
        st = cls().prepare(cw, LayerSpec(cw.scheme, K, 35))
        rows = torch.compile(lambda s=st: s.dequant_rows(3, 29), backend="eager", fullgraph=True)()
        assert torch.equal(rows, reference.dequantize(cw)[3:29]), cls.name


@functools.cache
def _op_cases() -> dict[str, tuple[object, tuple]]:
    """name: (op, args) for the traced ops on the prepared layers of every native family (awkward
    shapes; the layers are kept alive here, as the op names them by number)."""
    g = gen("opcheck")
    K, N = 512, 37
    x = torch.randn(3, K, generator=g)
    bias = torch.randn(N, generator=g)
    cases = {}
    for name, kernel, scheme, act in (
        ("gguf", gguf_native.CpuNativeGGUF, "gguf-q4_k", torch.float32),
        ("amx_gguf", amx.AmxGGUF, "gguf-q6_k", torch.float32),
        ("wint", wint_native.NativeWint, "w4a16-int-g64-asym", torch.bfloat16),
        ("amx_wint", amx.AmxWint, "w4a16-int-g64-asym", torch.float32),
        ("w8a8", wint_native.NativeW8A8Int8, "w8a8-int-ch-sym", torch.float32),
        ("lut", lut_native.NativeLut, "w4a16-nf4-g64", torch.float32),
        ("amx_lut", amx.AmxLut, "w4a16-nvfp4", torch.bfloat16),
    ):
        cw = reference.quantize(torch.randn(N, K, generator=g), scheme)
        st = kernel().prepare(cw, LayerSpec(cw.scheme, K, N, act_dtype=act))
        cases[f"{name}_linear"] = (st, torch.ops.quantrt.linear, (x.to(act), bias, st.id))
        if st.rows is not None:
            cases[f"{name}_rows"] = (st, torch.ops.quantrt.rows, (st._anchor, st.id, 5, 30))
    w = (torch.randn(N, K, generator=g) * 0.1).to(torch.bfloat16)
    dense = dense_native.DenseLinear(w, bias.to(torch.bfloat16), torch.bfloat16)
    p = dense._prepared[torch.bfloat16]
    cases["dense_linear"] = (dense, torch.ops.quantrt.linear, (x.to(torch.bfloat16), dense.bias, p.id))
    return {name: (op, args, keep) for name, (keep, op, args) in cases.items()}


OPS = (
    "gguf_linear",
    "gguf_rows",
    "amx_gguf_linear",
    "amx_gguf_rows",
    "wint_linear",
    "amx_wint_linear",
    "w8a8_linear",
    "lut_linear",
    "amx_lut_linear",
    "dense_linear",
)


@pytest.mark.parametrize("name", OPS)
def test_op_schema_and_fake_match_the_real_op(name: str) -> None:
    op, args, _ = _op_cases()[name]
    torch.library.opcheck(
        op, args, test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")
    )


def test_eager_calls_do_not_enter_the_op_layer(monkeypatch) -> None:
    """The eager hot path is the direct ctypes call: making the traced op's way to a prepared layer
    fail changes nothing."""
    g = gen("eager")
    layers = [quantized(s, n, 256, g)[0] for s, n in (("gguf-q4_k", 20), *SIDE)]
    dense = dense_native.DenseLinear(
        torch.randn(20, 256, generator=g).to(torch.bfloat16), None, torch.float32
    )

    def refuse(*args: object) -> object:
        raise AssertionError("an eager call went through the torch op")

    monkeypatch.setattr(prepared_module, "live", refuse)
    with pytest.raises(AssertionError, match="through the torch op"):  # the op would notice
        torch.ops.quantrt.linear(torch.randn(2, 256), None, layers[0]._state.id)
    x = torch.randn(2, 256, generator=g)
    for lin in (*layers, dense):
        assert torch.isfinite(lin(x)).all()
