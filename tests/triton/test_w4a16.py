"""The Triton W4A16 kernel against the fp32 reference: awkward shapes, adversarial codes,
act-order, every M strategy, bias and out=. On the CPU it runs under TRITON_INTERPRET=1 with
fp16 and fp32 activations (the interpreter's bf16 dot is wrong); tests/gpu runs it on the H200."""

from __future__ import annotations

import pytest
import torch

from quantrt import reference
from quantrt.backends.cuda.triton_kernels import CudaTritonW4A16, CudaTritonW8A16
from quantrt.backends.triton.common import TileConfig
from quantrt.backends.triton.w4a16 import w4a16_matmul
from quantrt.canonical import CanonicalWeight
from quantrt.capability import load_preset
from quantrt.plans import layer_spec
from quantrt.schemes import parse_scheme

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float16: 2e-3, torch.float32: 1e-5}


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double().cpu() - ref.double().cpu()).norm() / ref.double().cpu().norm())


def run(
    scheme: str,
    K: int,
    N: int,
    M: int,
    dtype: torch.dtype,
    seed: int,
    *,
    bias: bool = True,
    noncontig: bool = False,
) -> float:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=g) * 0.05
    w[:, torch.randint(0, K, (2,), generator=g)] *= 6
    canon = reference.quantize(w, scheme)
    spec = layer_spec(scheme, K, N, act_dtype=dtype, bias=bias)
    k = CudaTritonW8A16() if scheme.startswith("w8") else CudaTritonW4A16()
    state = k.prepare(canon.to(DEV), spec)
    x = torch.randn(M, 2 * K if noncontig else K, generator=g)
    x = (x[:, ::2] if noncontig else x).to(DEV, dtype)
    b = torch.randn(N, generator=g).to(DEV, dtype) if bias else None
    y = k.apply(state, x, b)
    assert y.shape == (M, N) and y.dtype == dtype
    return rel(
        y,
        reference.linear(
            x.float().cpu(), canon, None if b is None else b.float().cpu(), out_dtype=torch.float32
        ),
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize(
    "scheme,K,N",
    [
        ("w4a16-int-g128-asym", 256, 48),
        ("w4a16-int-g32-sym", 96, 33),  # N odd, K not a multiple of 64
        ("w4a16-int-g64-asym", 192, 40),
        ("w4a16-int-ch-sym", 160, 24),  # channel: one group of K
        ("w4a16-int-g64-sym-actorder", 128, 32),
        ("w4a16-int-g32-asym-actorder", 128, 20),
        ("w8a16-int-ch-sym", 160, 24),
        ("w8a16-int-g64-asym", 128, 33),
        ("w8a16-int-g32-sym-actorder", 96, 16),
    ],
)
def test_every_m_bucket_matches_the_reference(scheme: str, K: int, N: int, dtype: torch.dtype) -> None:
    for i, M in enumerate((1, 5, 17, 70)):  # GEMV/split-K, small, medium and large-M configs
        e = run(scheme, K, N, M, dtype, seed=K + N + M, noncontig=i == 1)
        assert e < TOL[dtype], (M, e)


def test_adversarial_codes_and_extreme_scales() -> None:
    K, N, G = 128, 32, 64
    s = parse_scheme("w4a16-int-g64-asym")
    for fill in (0x00, 0xFF, 0x0F):
        q = torch.full((N, K // 2), fill, dtype=torch.uint8)
        scales = torch.full((N, K // G), 2.0**-14, dtype=torch.float32)
        scales[::2] = 512.0
        zeros = torch.randint(0, 16, (N, K // G), dtype=torch.int16)
        canon = CanonicalWeight(s, N, K, {"qweight": q, "scales": scales, "zeros": zeros})
        x = torch.randn(3, K, dtype=torch.float32) * 0.01
        k = CudaTritonW4A16()
        state = k.prepare(canon.to(DEV), layer_spec(s, K, N, act_dtype=torch.float32))
        y = k.apply(state, x.to(DEV))
        ref = reference.linear(x, canon, out_dtype=torch.float32)
        assert rel(y, ref) < 1e-5, fill


def test_m_zero_and_out() -> None:
    g = torch.Generator().manual_seed(3)
    canon = reference.quantize(torch.randn(32, 64, generator=g), "w4a16-int-g32-asym").to(DEV)
    q, sc, z = canon["qweight"], canon["scales"].half(), canon["zeros"].half()
    y = w4a16_matmul(
        torch.empty(0, 64, dtype=torch.float16, device=DEV), q, sc, z, None, 32, None, TileConfig(16, 32, 32)
    )
    assert y.shape == (0, 32)
    out = torch.full((2, 32), float("nan"), dtype=torch.float16, device=DEV)
    x = torch.randn(2, 64, generator=g).half().to(DEV)
    for split in (1, 2):
        w4a16_matmul(x, q, sc, z, None, 32, None, TileConfig(16, 32, 32, split_k=split), out=out)
        assert rel(out, reference.linear(x.float().cpu(), canon.to("cpu"), out_dtype=torch.float32)) < 2e-3


def test_supports_and_plans() -> None:
    h100 = load_preset("h100").default_device
    assert CudaTritonW4A16.supports(layer_spec("w4a16-int-g128-asym", 4096, 4096), h100).ok
    assert CudaTritonW4A16.supports(
        layer_spec("w4a16-int-g128-asym", 4096, 4096, act_dtype=torch.float16), h100
    ).ok
    v = CudaTritonW4A16.supports(
        layer_spec("w4a16-int-g128-asym", 4096, 4096), load_preset("mi300x").default_device
    )
    assert not v.ok and v.predicate.startswith("sm >= 80")  # AMD runs rocm.triton_w4a16 instead
    v = CudaTritonW4A16.supports(layer_spec("w4a16-int-g48-sym", 4800, 64), h100)
    assert (v.predicate, dict(v.values)) == ("group size a multiple of 32", {"G": 48})


def test_traced_op_and_fake() -> None:
    """torch.compile traces the kernel through the prepared layer's op (quantrt::linear): its fake
    checked by torch's opcheck, a fullgraph trace without a graph break, the eager result."""
    g = torch.Generator().manual_seed(4)
    canon = reference.quantize(torch.randn(32, 64, generator=g), "w4a16-int-g32-asym").to(DEV)
    k = CudaTritonW4A16()
    state = k.prepare(canon, layer_spec("w4a16-int-g32-asym", 64, 32, act_dtype=torch.float16))
    x = torch.randn(3, 64, generator=g).half().to(DEV)
    y = torch.ops.quantrt.linear(x, None, state.id)
    assert rel(y, reference.linear(x.float().cpu(), canon.to("cpu"), out_dtype=torch.float32)) < 2e-3
    assert torch.equal(y, k.apply(state, x))
    torch.library.opcheck(
        torch.ops.quantrt.linear.default, (x, None, state.id), test_utils=("test_faketensor",)
    )
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: state(t), backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(x), y)
