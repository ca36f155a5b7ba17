"""The canonical -> peer layouts of ``bench/peers.py``, checked on the CPU with the peers' own code.

bitsandbytes: the ``QuantState`` built from a canonical NF4 weight must dequantize, through bnb's
own ``dequantize_4bit``, to exactly quantrt's reference weight; bnb's own ``quantize_4bit`` must
produce the canonical bytes and absmax; and ``bnb.matmul_4bit`` must agree with the reference.
gemlite: ``GemLiteLinear.pack`` on the canonical codes must produce the GPTQ words Marlin gets,
and its stored scales/zeros, decoded the way its kernels' ``dequantize`` does, must give the
reference weight. Each peer is a wheel in ``.peers/wheels`` and never a requirement: without it
the tests skip. gemlite probes the GPU when imported, so without one it is imported with those
probes stubbed (its packing then runs in torch on the CPU).
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch

from quantrt import reference
from quantrt.bench import random_weight

ROOT = Path(__file__).resolve().parents[2]


def load_peers() -> Any:
    """``bench/peers.py`` as a module (bench/ is no package)."""
    if "peers" in sys.modules:
        return sys.modules["peers"]
    spec = importlib.util.spec_from_file_location("peers", ROOT / "bench" / "peers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["peers"] = module
    spec.loader.exec_module(module)
    return module


peers = load_peers()


def bnb() -> Any:
    return pytest.importorskip("bitsandbytes", reason="bitsandbytes is a peer wheel (.peers/wheels)")


def gemlite() -> Any:
    """gemlite, imported with its import-time GPU probes stubbed where there is no GPU."""
    if "gemlite" in sys.modules or torch.cuda.is_available():
        return pytest.importorskip("gemlite", reason="gemlite is a peer wheel (.peers/wheels)")
    if importlib.util.find_spec("gemlite") is None:
        pytest.skip("gemlite is a peer wheel (.peers/wheels)")
    import triton
    from triton.runtime import _allocation
    from triton.runtime import driver as drv

    props = types.SimpleNamespace(name="no gpu", multi_processor_count=1)
    target = types.SimpleNamespace(backend="cuda", arch=90, warp_size=32)
    utils = types.SimpleNamespace(get_device_properties=lambda i: {"max_shared_mem": 232448})
    fake = types.SimpleNamespace(get_current_target=lambda: target, utils=utils)
    allocator = _allocation._allocator.get()
    try:
        with (
            mock.patch("torch.cuda.get_device_capability", return_value=(9, 0)),
            mock.patch("torch.cuda.get_device_properties", return_value=props),
            mock.patch.object(type(drv), "active", new=fake),
        ):
            import gemlite as module
    except Exception as e:  # a gemlite whose import needs more than these stubs
        pytest.skip(f"gemlite does not import without a GPU here: {type(e).__name__}: {e}")
    finally:
        triton.set_allocator(allocator)  # gemlite sets a CUDA allocator at import
    return module


# bitsandbytes ----------------------------------------------------------------------------------

BNB_CASES = [
    ("w4a16-nf4-g64", 96, 256),
    ("w4a16-nf4-g64", 7, 40),  # N*K = 280: a ragged last block and an odd nibble count
    ("w4a16-nf4-g128", 64, 384),
    ("w4a16-nf4-g64-dq", 64, 512),
]


@pytest.mark.parametrize("scheme,N,K", BNB_CASES)
def test_bnb_quant_state_dequantizes_to_reference(scheme: str, N: int, K: int) -> None:
    F = bnb().functional
    torch.manual_seed(N * K)
    canon = random_weight(scheme, N, K, device="cpu")
    assert peers.bnb_unsupported_reason(canon) is None
    weight, state = peers.bnb_quant_state(canon, torch.float32)
    assert weight.shape == ((N * K + 1) // 2, 1) and weight.data_ptr() == canon["qweight"].data_ptr()
    assert torch.equal(F.dequantize_4bit(weight, state), reference.dequantize(canon))
    _, state16 = peers.bnb_quant_state(canon, torch.bfloat16)
    assert F.dequantize_4bit(weight, state16).dtype == torch.bfloat16


@pytest.mark.parametrize("G,dq", [(64, False), (64, True), (128, False)])
def test_bnb_quantizer_gives_the_canonical_weight(G: int, dq: bool) -> None:
    """bnb's own quantizer on a dense weight yields the bytes and absmax of quantrt's canonical form
    (so the baseline runs on the weight a bnb user would have made)."""
    F = bnb().functional
    torch.manual_seed(G)
    w = torch.randn(64, 256) * 0.02
    q, state = F.quantize_4bit(w, blocksize=G, quant_type="nf4", compress_statistics=dq)
    canon = reference.quantize(w, f"w4a16-nf4-g{G}" + ("-dq" if dq else ""))
    assert torch.equal(q.reshape(-1), canon["qweight"])
    assert torch.equal(state.absmax, canon["absmax"])
    if dq:
        assert torch.equal(state.state2.absmax, canon["nested_absmax"])
        assert float(state.offset) == float(canon["offset"][0])


def test_bnb_matmul_matches_reference() -> None:
    lib = bnb()
    torch.manual_seed(3)
    canon = random_weight("w4a16-nf4-g64", 128, 512, device="cpu")
    weight, state = peers.bnb_quant_state(canon, torch.bfloat16)
    x = torch.randn(5, 512).to(torch.bfloat16)
    y = lib.matmul_4bit(x, weight, quant_state=state)
    ref = reference.linear(x, canon, out_dtype=torch.float32, weight_only=True)
    assert y.shape == (5, 128) and y.dtype == torch.bfloat16
    assert float((y.float() - ref).abs().max() / ref.abs().max()) < 1e-2


# gemlite ---------------------------------------------------------------------------------------


def gemlite_weight(layer: Any, N: int, K: int) -> torch.Tensor:
    """fp32 [N, K] from a packed GemLiteLinear, decoded as its kernels' ``dequantize`` does:
    W_q [K / e, N] of e codes per word along K, scales/zeros [K / G, N]; group mode 3 is
    (q - zero) * scale with a scalar zero, mode 4 fma(q, scale, zero) with zero = -z * scale."""
    from gemlite.bitpack import unpack_over_cols_torch

    q = unpack_over_cols_torch(layer.W_q.t().contiguous(), layer.W_nbits, K, torch.int32)  # [N, K]
    g = torch.arange(K) // layer.group_size
    s = layer.scales.t().float()[:, g]
    if layer.W_group_mode == 3:
        assert layer.zeros.numel() == 1
        w = (q - int(layer.zeros)).float() * s
    else:
        assert layer.W_group_mode == 4
        w = torch.addcmul(layer.zeros.t().float()[:, g], q.float(), s)
    return w.to(torch.bfloat16).float()  # the kernels dequantize into the bf16 meta dtype


@pytest.mark.parametrize("scheme", ["w4a16-int-g128-sym", "w4a16-int-g128-asym", "w4a16-int-g64-asym"])
def test_gemlite_pack_matches_reference(scheme: str) -> None:
    gemlite()
    N, K = 96, 512
    torch.manual_seed(N + K)
    canon = random_weight(scheme, N, K, device="cpu")
    assert peers.gemlite_unsupported_reason(canon) is None
    layer = peers.gemlite_layer(canon)
    assert layer.elements_per_sample == 8 and layer.data_contiguous
    assert layer.W_group_mode == (3 if canon.scheme.symmetric else 4)
    # gemlite's words are the GPTQ words Marlin gets: 8 consecutive k per int32, LSB first
    assert torch.equal(layer.W_q, peers.gptq_qweight(canon))
    got = gemlite_weight(layer, N, K)
    ref = reference.dequantize(canon)
    G = canon.scheme.group_size
    # bf16 scales (2^-8 relative), bf16(-z * s) and the bf16 result: a few ulps of one scale step;
    # a layout slip moves codes by whole scale steps
    step = canon["scales"].repeat_interleave(G, dim=1)
    assert float(((got - ref).abs() / step).max()) < 0.15


@pytest.mark.parametrize(
    ("peer", "scheme", "K", "why"),
    [
        ("bnb", "w4a16-int-g128-sym", 256, "not bitsandbytes NF4"),
        ("bnb", "w4a16-bnbfp4-g64", 256, "not bitsandbytes NF4"),
        ("gemlite", "w4a16-nf4-g64", 256, "not grouped integer"),
        ("gemlite", "w4a16-int-ch-sym", 256, "not grouped integer"),
        ("gemlite", "w4a16-int-g128-sym", 128, "K > G"),
    ],
)
def test_refusals_are_reasons(peer: str, scheme: str, K: int, why: str) -> None:
    """Reasons, not exceptions, for weights a peer baseline cannot run (no package needed)."""
    reason = getattr(peers, f"{peer}_unsupported_reason")(random_weight(scheme, 64, K, device="cpu"))
    assert why in reason


@pytest.mark.parametrize(
    ("baseline", "scheme"), [("bnb_nf4", "w4a16-nf4-g64"), ("gemlite", "w4a16-int-g128-sym")]
)
def test_no_cuda_is_a_reason(baseline: str, scheme: str) -> None:
    assert getattr(peers, f"{baseline}_baseline")(random_weight(scheme, 64, 256, device="cpu")) is None
    assert "CUDA" in peers.last_reason
