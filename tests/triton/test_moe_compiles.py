"""The fused MoE kernel compiled for sm_90 (Triton's own ptxas, no GPU needed) on the constexpr
combinations the tile tables reach. The interpreter runs Python semantics, so it cannot see what
only the compiler rejects (a static ``if`` whose branch returns early is compiled past its return;
dot shapes after a transposition); this catches those on the CPU, before a GPU run does. It also
checks that the weight-only K loop is software-pipelined (cp.async) and that the transposed
(swap) product runs on Hopper's wgmma, with the portable decodes and the PTX ones
(``backends/cuda/triton_decode.py``). tests/triton runs interpreted, so the compiles happen in
one child process without TRITON_INTERPRET (this file run as a script)."""

from __future__ import annotations

import inspect
import re

import pytest
from sm90_child import child_main, results

PTRS = {
    "X": "*bf16", "XS": "*fp32", "W": "*u8", "S": "*bf16", "Z": "*bf16", "R": "*fp32", "B": "*bf16",
    "TW": "*fp32", "SID": "*i32", "BEXP": "*i32", "NPAD": "*i32", "ORDER": "*i64", "OFFS": "*i64", "Y": "*bf16",
}  # fmt: skip
#: arguments a real launch has divisible by 16 (Triton specialises on that) and unit strides
DIV16 = {
    *PTRS,
    "A",
    "N",
    "K",
    "KW",
    "stride_xm",
    "stride_we",
    "stride_wn",
    "stride_se",
    "stride_sn",
    "stride_ym",
}
BASE = dict(
    KIND=0, BITS=4, G=128, P=32, QN=1, QK=1, SKIND=0, GROUPED=True, HAS_Z=False, ACT=0, INT_DOT=False,
    HAS_R=False, HAS_B=True, WEIGHTED=True, BM=16, BN=128, BK=128, GM=1, SPLIT_K=1, SWAP=True, STAGES=4,
    EVEN_K=True, IEEE=False, LANE=False, stride_xk=1,
)  # fmt: skip


def _compile(cx: dict) -> str:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from quantrt.backends.cuda import triton_decode
    from quantrt.backends.triton import moe

    cx = dict(cx)
    ptx = cx.pop("PTX", 0)
    cx["DEC4"], cx["DECF"] = (
        (triton_decode.int4_minus, triton_decode.e2m1_scaled) if ptx else (moe._nibble_minus, moe._fp4_decode)
    )
    params = list(inspect.signature(moe._moe_kernel.fn).parameters)
    sig = {p: PTRS.get(p, "constexpr" if p in cx else "i32") for p in params}
    if cx["KIND"] >= 2:
        sig.update(X="*fp8e4nv", W="*fp8e4nv", S="*fp32")
    elif cx["KIND"] == 1:
        sig.update(S="*u8")  # fp4 scale codes
    attrs = {(params.index(p),): [["tt.divisibility", 16]] for p in DIV16}
    k = triton.compile(
        ASTSource(moe._moe_kernel, sig, constexprs=cx, attrs=attrs),
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": 4, "num_stages": int(cx["STAGES"])},
    )
    return k.asm["ptx"]


WEIGHT_ONLY = {
    "int4-g128": dict(KIND=0, BITS=4),
    "int4-ch-asym-ragged": dict(KIND=0, BITS=4, GROUPED=False, HAS_Z=True, EVEN_K=False, BN=64, SPLIT_K=2),
    "int8-asym": dict(KIND=0, BITS=8, HAS_Z=True, P=1),
    "mxfp4": dict(KIND=1, G=32, SKIND=1),
    "nvfp4-ragged": dict(KIND=1, G=16, SKIND=3, HAS_R=True, EVEN_K=False),  # bf16_byte scales
    "nvfp4-lane": dict(KIND=1, G=16, SKIND=4, HAS_R=True, P=64, LANE=True),  # the CUDA kernel's layout
    "mxfp4-lane": dict(KIND=1, G=32, SKIND=4, HAS_R=True, P=64, LANE=True),
}
VARIANTS = {
    **{
        f"{n}-{'swap' if sw else 'tiles'}": dict(BASE, SWAP=sw, **v)
        for n, v in WEIGHT_ONLY.items()
        for sw in (0, 1)
    },
    **{
        f"{n}-ptx-{'swap' if sw else 'tiles'}": dict(BASE, SWAP=sw, PTX=1, **v)
        for n, v in WEIGHT_ONLY.items()
        if n != "int8-asym"
        for sw in (0, 1)
    },
    **{f"w8a8-bm{bm}": dict(BASE, KIND=2, BITS=8, P=1, ACT=1, BM=bm, SWAP=0, STAGES=3) for bm in (16, 128)},
}


@pytest.fixture(scope="module")
def compiled() -> dict:
    """Every variant's PTX markers (or its error), from one child process."""
    return results(__file__)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_compiles_for_sm90(compiled: dict, name: str) -> None:
    got = compiled[name]
    assert "error" not in got, got.get("error")
    assert got["cp_async"], "the K loop's loads are not pipelined"
    if VARIANTS[name]["KIND"] <= 1:  # weight-only: swap on wgmma, tiles on mma.sync
        assert got["wgmma"] if VARIANTS[name]["SWAP"] else got["mma_sync"]


def _markers(cx: dict) -> dict:
    ptx = _compile(cx)
    return {
        "cp_async": bool(re.search(r"cp\.async\.c[ag]", ptx)),
        "wgmma": "wgmma.mma_async" in ptx,
        "mma_sync": "mma.sync" in ptx,
    }


if __name__ == "__main__":
    child_main(VARIANTS, _markers)
