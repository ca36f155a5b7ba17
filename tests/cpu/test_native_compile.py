"""torch.compile(fullgraph=True) over the native CPU kernels (eager and inductor backends).

The kernels call C code through ``ctypes`` with raw data pointers; torch.compile cannot trace that
(with fullgraph it refuses, without it the graph break freed the GGUF workspace before the C code
wrote it: heap corruption). Under compile every native entry point runs as its ``quantrt_cpu::`` op
(backends/cpu/native_common.py), which owns its output and workspace. Checked here: a module of
QuantLinear layers of several families compiles into one graph, gives the eager output, and stays
within DESIGN.md's bound of the fp32 reference; the AMX path's dequantize-then-matmul; each op's
schema and fake against its real implementation (``torch.library.opcheck``); and eager calls
never enter the op layer (their host cost stays the direct ``ctypes`` call's).
"""

from __future__ import annotations

import functools
import zlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

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
    """cpu.amx_*'s dequantize-then-matmul path (run here from M=2) and GGUF's ``dequant_rows`` traced:
    each slice from the family's dequant op, then torch.mm, as eagerly from the reused scratch."""
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
        state = kernel.prepare(cw, spec)
        state.amx_from, state.rows = 2, 16  # the dequant path from 2 rows, in slices of 16 rows
        bias = torch.randn(N, generator=g)
        x = torch.randn(5, K, generator=g)
        fn = torch.compile(lambda v, b, k=kernel, s=state: k.apply(s, v, b), backend="eager", fullgraph=True)
        got, want = fn(x, bias), kernel.apply(state, x, bias)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        ref = reference.linear(x, cw, bias, out_dtype=torch.float32)
        assert rel(got, ref) < DESIGN, f"{cls.name}: {rel(got, ref):.3g} from the reference"
    cw = reference.quantize(torch.randn(35, K, generator=g), "gguf-q6_k")
    gk = gguf_native.CpuNativeGGUF()
    st = gk.prepare(cw, LayerSpec(cw.scheme, K, 35))
    rows = torch.compile(lambda s=st: gk.dequant_rows(s, 3, 29), backend="eager", fullgraph=True)()
    assert torch.equal(rows, reference.dequantize(cw)[3:29])


@functools.cache
def _op_cases() -> dict[str, tuple[object, tuple]]:
    """name: (op, args) for every quantrt_cpu op that runs here, on prepared states of awkward shapes."""
    g = gen("opcheck")
    K, N = 512, 37
    x = torch.randn(3, K, generator=g)
    bias = torch.randn(N, generator=g)
    cases = []
    cw = reference.quantize(torch.randn(N, K, generator=g), "gguf-q4_k")
    st = gguf_native.CpuNativeGGUF().prepare(cw, LayerSpec(cw.scheme, K, N))
    gargs = (st.weight, st.type_code, st.N, st.K, st.groups)
    cases.append(
        ("gguf_linear", gguf_native.LINEAR_OP, (st.weight, x, bias, *gargs[1:], st.ws_row, torch.float32))
    )
    cases.append(("gguf_dequant_rows", gguf_native.DEQUANT_OP, (*gargs, 5, 30, torch.bfloat16)))
    cw = reference.quantize(torch.randn(N, K, generator=g), "w4a16-int-g64-asym")
    ws = wint_native.NativeWint().prepare(cw, LayerSpec(cw.scheme, K, N))
    t = ws.tensors
    wt = (t["q"], t["scales"], t.get("zeros"), t.get("perm"))
    cases.append(
        ("wint_linear", wint_native.WINT_OP, (*wt, x, bias, ws.ints, ws.large_m, ws.tiles_m, torch.bfloat16))
    )
    cases.append(("wint_dequant_rows", wint_native.WINT_DEQUANT_OP, (*wt, ws.ints, 0, N, torch.float32)))
    cw = reference.quantize(torch.randn(N, K, generator=g), "w8a8-int-ch-sym")
    a8 = wint_native.NativeW8A8Int8().prepare(cw, LayerSpec(cw.scheme, K, N))
    a8args = (a8.tensors["q"], a8.tensors["scales"], x, None, a8.ints, a8.in_scale, a8.large_m, torch.float32)
    cases.append(("w8a8_linear", wint_native.W8A8_OP, a8args))
    cw = reference.quantize(torch.randn(N, K, generator=g), "w4a16-nf4-g64")
    ls = lut_native.NativeLut().prepare(cw, LayerSpec(cw.scheme, K, N))
    t = ls.tensors
    lt = (t["q"], t.get("scales"), t.get("rowscale"), t["tab"])
    cases.append(
        ("lut_linear", lut_native.LUT_OP, (*lt, x, bias, ls.ints, ls.large_m, ls.tiles_m, torch.float32))
    )
    code = cw["code"].float().contiguous()
    cases.append(("lut_dequant_rows", lut_native.LUT_DEQUANT_OP, (*lt, code, ls.ints, 2, 19, torch.float32)))
    w = (torch.randn(N, K, generator=g) * 0.1).to(torch.bfloat16)
    cases.append(("dense_linear", dense_native.DENSE_OP, (w, x.to(torch.bfloat16), bias.to(torch.bfloat16))))
    return {name: (op, args) for name, op, args in cases}


OPS = (
    "gguf_linear",
    "gguf_dequant_rows",
    "wint_linear",
    "wint_dequant_rows",
    "w8a8_linear",
    "lut_linear",
    "lut_dequant_rows",
    "dense_linear",
)


@pytest.mark.parametrize("name", OPS)
def test_op_schema_and_fake_match_the_real_op(name: str) -> None:
    op, args = _op_cases()[name]
    torch.library.opcheck(
        op, args, test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")
    )


def test_eager_calls_do_not_enter_the_op_layer(monkeypatch) -> None:
    """The eager hot path is the direct ctypes call: replacing every op by a failure changes nothing."""
    g = gen("eager")
    layers = [quantized(s, n, 256, g)[0] for s, n in (("gguf-q4_k", 20), *SIDE)]
    dense = dense_native.DenseLinear(
        torch.randn(20, 256, generator=g).to(torch.bfloat16), None, torch.float32
    )

    def refuse(*args: object) -> torch.Tensor:
        raise AssertionError("an eager call went through the torch op")

    for module, attr in (
        (gguf_native, "LINEAR_OP"),
        (wint_native, "WINT_OP"),
        (wint_native, "W8A8_OP"),
        (lut_native, "LUT_OP"),
        (dense_native, "DENSE_OP"),
    ):
        monkeypatch.setattr(module, attr, refuse)
    x = torch.randn(2, 256, generator=g)
    for lin in (*layers, dense):
        assert torch.isfinite(lin(x)).all()
