"""The one-launch W8A8 GEMV compiled for sm_90 (Triton's own ptxas, no GPU needed) over the
constexprs ci/tune_w8a8_gemv.py sweeps: fp8 with the hardware cast (the sm_89+ path the interpreter
never takes) and int8, every activation mode, one to four rows. It must compile without
spilling to local memory (one row in 128 registers), and on the fp8 path use the hardware conversions.
tests/triton runs interpreted, so the compiles happen in one child process without
TRITON_INTERPRET (this file run as a script)."""

from __future__ import annotations

import inspect
import re
import subprocess
import tempfile
from pathlib import Path

import pytest
from sm90_child import child_main, results

DIV16 = {"X", "W", "WS", "IS", "B", "Y", "N", "K", "stride_xm", "stride_wn", "stride_ym"}
FP8 = dict(INT8=False, HW_FP8=True, FMAX=448.0, MANT=3, EMIN=-6, NAN=0x7F, NEG_ZERO=True, QTY="float8e4nv")
INT8 = dict(INT8=True, HW_FP8=False, FMAX=127.0, MANT=0, EMIN=0, NAN=0, NEG_ZERO=False, QTY="int8")
#: (block_n, block_k, warps): 16 or 32 weight codes per thread and step, as the sweep's grid has them
TILES = ((8, 512, 4), (16, 256, 4), (16, 512, 8))
VARIANTS = {
    f"{kind}-{act}-mb{mb}-bn{bn}-bk{bk}-w{w}": dict(
        enc,
        ACT={"static": 0, "token": 1, "tensor": 2}[act],
        MB=mb,
        BN=bn,
        BK=bk,
        EVEN_K=True,
        HAS_B=True,
        WARPS=w,
    )
    for kind, enc in (("fp8", FP8), ("int8", INT8))
    for act in (("static", "token", "tensor") if kind == "fp8" else ("static", "token"))
    for mb in (1, 2, 4)
    for bn, bk, w in TILES
}


def _compile(cx: dict) -> dict:
    """One variant's figures: registers and spills (ptxas's report), the fp8 conversions used."""
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from quantrt.backends.triton import w8a8_gemv

    cx = dict(cx)
    warps = cx.pop("WARPS")
    cx["QTY"] = getattr(tl, cx["QTY"])
    fn = w8a8_gemv._w8a8_gemv_kernel
    params = list(inspect.signature(fn.fn).parameters)
    ptrs = {
        "X": "*bf16",
        "W": "*i8" if cx["INT8"] else "*fp8e4nv",
        "WS": "*fp32",
        "IS": "*fp32",
        "B": "*bf16",
    }
    sig = {p: ptrs.get(p, "*bf16" if p == "Y" else "constexpr" if p in cx else "i32") for p in params}
    sig.update(qmax="fp32", scale_mult="fp32")
    attrs = {(params.index(p),): [["tt.divisibility", 16]] for p in DIV16}
    k = triton.compile(
        ASTSource(fn, sig, constexprs={**cx, "stride_xk": 1}, attrs=attrs),
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": warps, "num_stages": 3},
    )
    ptx = k.asm["ptx"]
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "k.ptx"
        src.write_text(ptx)
        r = subprocess.run(
            [str(ptxas), "-v", "--gpu-name", "sm_90a", str(src), "-o", str(Path(d) / "k.cubin")],
            capture_output=True,
            text=True,
        )
    report = r.stdout + r.stderr
    regs = re.search(r"Used (\d+) registers", report)
    spills = [int(v) for v in re.findall(r"(\d+) bytes spill (?:stores|loads)", report)]
    return {
        "registers": int(regs.group(1)) if regs else 0,
        "spill_bytes": sum(spills) if spills else (0 if regs else -1),
        "cvt_to_fp8": bool(re.search(r"cvt\.rn\.satfinite\.e4m3x2", ptx)),
        "cvt_from_fp8": bool(re.search(r"cvt\.rn\.f16x2\.e4m3x2", ptx)),
    }


@pytest.fixture(scope="module")
def compiled() -> dict:
    """Every variant's figures (or its error), from one child process."""
    return results(__file__)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_compiles_for_sm90_without_spills(compiled: dict, name: str) -> None:
    got = compiled[name]
    assert "error" not in got, got.get("error")
    # the accumulator holds every row: one row fits 128 registers, more rows take more, and no
    # variant puts more than a stray 8-byte value in local memory
    cap = 128 if VARIANTS[name]["MB"] == 1 else 255
    assert 0 < got["registers"] <= cap and 0 <= got["spill_bytes"] <= 16, got
    if not VARIANTS[name]["INT8"]:  # x's codes by the hardware cast, the weight's widened by it
        assert got["cvt_to_fp8"] and got["cvt_from_fp8"], got


if __name__ == "__main__":
    child_main(VARIANTS, _compile)
