"""The NEON builds of the native CPU kernels, cross-compiled here and run under qemu-aarch64 user
emulation on small awkward shapes: GGUF (native/csrc/gguf.cpp) on every type against the independent
integer reference (gguf_reference.py), without the dot-product extension, with it (SDOT), with the
int8 matrix-multiply one (SMMLA) and with SVE (alone and with SMMLA; run at vector lengths of 128, 256
and 512 bits), which must agree bit for bit; the integer weight-only kernel
(native/csrc/wint_neon.cpp) on cpu.native_wint's prepared layout and the code-book/float kernel
(native/csrc/lut_neon.cpp) on cpu.native_lut's, against the fp32 reference: every bit width,
granularity, zero points and act-order; NF4, bnb FP4, NVFP4, MXFP4, fp8 (W8A8 fp8 through its
activation quantization).

Needs a cross compiler (g++-aarch64-linux-gnu) and qemu-user: ci/setup.sh installs both where it can
(Debian/Ubuntu as root) and sets QUANTRT_NEON_TESTS=1, which turns their absence into a failure."""

from __future__ import annotations

import functools
import os
import shutil
import struct
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf_reference import integer_reference

from quantrt import reference
from quantrt.backends.cpu.gguf_native import TYPE_CODES
from quantrt.backends.cpu.lut_native import FIELDS, GEMV_FIELDS, prepare_lut
from quantrt.backends.cpu.native.build import CSRC
from quantrt.backends.cpu.wint_native import WINT_FIELDS, prepare_wint
from quantrt.reference.gguf import random_blocks
from quantrt.schemes import GGUF_TYPES
from quantrt.specs import LayerSpec

CXX = shutil.which("aarch64-linux-gnu-g++")
QEMU = shutil.which("qemu-aarch64")
SYSROOT = Path("/usr/aarch64-linux-gnu")
REQUIRED = os.environ.get("QUANTRT_NEON_TESTS") == "1"
MISSING = [n for n, p in (("aarch64-linux-gnu-g++", CXX), ("qemu-aarch64", QEMU)) if p is None]
if MISSING and REQUIRED:
    raise RuntimeError(
        f"QUANTRT_NEON_TESTS=1 but {', '.join(MISSING)} not on PATH (ci/setup.sh installs them)"
    )
pytestmark = pytest.mark.skipif(
    bool(MISSING), reason=f"needs {', '.join(MISSING)} (ci/setup.sh installs them)"
)
CROSS = Path(__file__).parent / "cross"
#: -march levels: plain ARMv8 NEON (the widening-multiply path), ARMv8.2 with SDOT, ARMv8.6 with
#: SMMLA (qemu's default cpu "max" emulates FEAT_I8MM), and SVE builds without and with SMMLA
MARCH = {
    "neon": "armv8-a",
    "dotprod": "armv8.2-a+dotprod",
    "i8mm": "armv8.6-a+i8mm",
    "sve": "armv8.2-a+sve+dotprod",
    "sve-i8mm": "armv8.6-a+sve+i8mm",
}
#: SVE vector lengths (bytes) the SVE builds run at: 128 bits takes the NEON kernel, 256 and 512 the SVE one
SVE_VL = (16, 32, 64)


def vl_args(vl: int | None) -> tuple[str, ...]:
    """qemu-aarch64 arguments for an SVE vector length of vl bytes (None: qemu's default)."""
    return () if vl is None else ("-cpu", f"max,sve-default-vector-length={vl}")


#: (level, SVE vector length in bytes or None) for every run of the bit-for-bit test
RUNS = [(lv, None) for lv in sorted(MARCH) if not lv.startswith("sve")] + [
    (lv, vl) for lv in sorted(MARCH) if lv.startswith("sve") for vl in SVE_VL
]
EXACT = 1e-5


def cross_build(out: Path, march: str, harness: str, source: str, *defines: str) -> Path:
    """A static aarch64 executable of a driver in cross/ and one library source."""
    cmd = [
        CXX, f"-march={march}", "-O2", "-std=c++17", "-fopenmp", "-fno-math-errno", "-static", *defines,
        f"-I{CSRC}", str(CROSS / harness), str(CSRC / source), "-o", str(out),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def qemu(binary: Path, src: Path, dst: Path, *args: str) -> bytes:
    """Run a cross-built driver under qemu-aarch64 (with extra qemu arguments) on one input file; its
    output file's bytes."""
    cmd = [QEMU, *args, "-L", str(SYSROOT), str(binary), str(src), str(dst)]
    done = subprocess.run(cmd, capture_output=True, timeout=300)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    return dst.read_bytes()


@pytest.fixture(scope="module")
def gguf_build(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """The GGUF driver at a MARCH level, each level built once for the module."""
    root = tmp_path_factory.mktemp("neon")

    @functools.cache
    def build(level: str) -> Path:
        return cross_build(root / f"gguf-{level}", MARCH[level], "gguf_harness.cpp", "gguf.cpp")

    return build


@pytest.fixture(
    scope="module",
    params=[(lv, None) for lv in sorted(MARCH) if not lv.startswith("sve")] + [("sve", 32), ("sve-i8mm", 32)],
    ids=lambda p: p[0] if p[1] is None else f"{p[0]}-vl{8 * p[1]}",
)
def binary(request: pytest.FixtureRequest, gguf_build: Callable[[str], Path]) -> tuple[Path, tuple[str, ...]]:
    """A build and its qemu arguments: every non-SVE level, and the SVE ones at 256 bits (the SVE kernel)."""
    level, vl = request.param
    return gguf_build(level), vl_args(vl)


def run(
    binary: Path, gtype: str, q: torch.Tensor, x: torch.Tensor, tmp: Path, args: tuple[str, ...] = ()
) -> tuple[int, torch.Tensor]:
    N, K, M = q.shape[0], x.shape[1], x.shape[0]
    src, dst = tmp / f"{gtype}.in", tmp / f"{gtype}.out"
    w = q.contiguous().numpy().tobytes()
    src.write_bytes(
        struct.pack("<iqqqq", TYPE_CODES[gtype], N, K, M, len(w))
        + w
        + x.float().contiguous().numpy().tobytes()
    )
    raw = qemu(binary, src, dst, *args)
    group = struct.unpack("<i", raw[:4])[0]
    return group, torch.from_numpy(np.frombuffer(raw[4:], dtype="<f4").copy()).reshape(M, N)


def problem(gtype: str, M: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random bytes in every field (codes, scales, mins, signs) with finite f16 scales, N = 19 rows (odd:
    the SMMLA build's last weight row has no partner), 3 blocks along K; M rows of x with outliers, row 2
    (where there is one) all zero: zero scales, zero outputs."""
    B = GGUF_TYPES[gtype][0]
    q = random_blocks(gtype, 19, 3 * B, seed)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, 3 * B, generator=g)
    x[:, torch.randint(0, 3 * B, (3,), generator=g)] *= 20
    if M > 2:
        x[2] = 0.0
    return q, x


@pytest.mark.parametrize("gtype", sorted(GGUF_TYPES))
def test_every_type_against_the_integer_reference(
    binary: tuple[Path, tuple[str, ...]], gtype: str, tmp_path: Path
) -> None:
    """M = 1, 6 and 7: the kernel takes activation rows 4 at a time, so every count 1 to 4 runs, and an
    odd one leaves the SMMLA build a row for SDOT (or SVE); the NEON builds keep every row canonical.
    M = 1 sends the SVE+SMMLA build's weight row pairs through the SVE kernel."""
    path, args = binary
    seed = int.from_bytes(os.urandom(4), "little")
    for M in (1, 6, 7):
        q, x = problem(gtype, M, seed)
        group, y = run(path, gtype, q, x, tmp_path, args)
        assert group == 0
        ref = integer_reference(x, q, gtype)
        if M > 2:
            assert not y[2].any()
        err = float((y.double() - ref).norm() / ref.norm())
        assert err < EXACT, f"{gtype} M={M} seed {seed}: {err:.3g}"


@pytest.mark.parametrize("gtype", sorted(GGUF_TYPES))
def test_builds_agree_bit_for_bit(gguf_build: Callable[[str], Path], gtype: str, tmp_path: Path) -> None:
    """Every block's integer sum is exact and each build adds it to its row by the same fp32 expression,
    so plain NEON, SDOT, SMMLA and SVE (at 128 bits: NEON; at 256 and 512: the SVE kernel) give the same
    bits; M = 5: two SMMLA pairs, then a row for SDOT (SVE); M = 1: the SVE+SMMLA build's decode path."""
    seed = int.from_bytes(os.urandom(4), "little")
    for M in (1, 5):
        q, x = problem(gtype, M, seed)
        ys = {
            (level, vl): run(gguf_build(level), gtype, q, x, tmp_path, vl_args(vl))[1] for level, vl in RUNS
        }
        want = ys[("neon", None)].view(torch.int32)
        for (level, vl), y in ys.items():
            assert torch.equal(y.view(torch.int32), want), f"{gtype} {level} vl={vl} M={M} seed {seed}"


# -- the weight-only GEMVs on the x86 kernels' prepared layouts --------------------------------------


def run_prepared(
    binary: Path, lay: object, all_fields: tuple, arrays: tuple, x: torch.Tensor, N: int, tmp: Path
):
    """y of a prepared layout (its descriptor, each pointer field replaced by its tensor's byte count, then
    those tensors' bytes in ``arrays`` order) on fp32 x, run by a cross-built driver under qemu."""
    tensors = [lay.tensors.get(n) for n in arrays]
    fields = list(lay.desc)
    for name, t in zip(arrays, tensors, strict=True):
        fields[all_fields.index(name)] = 0 if t is None else t.numel() * t.element_size()
    blobs = b"".join(t.contiguous().numpy().tobytes() for t in tensors if t is not None)
    src, dst = tmp / "layer.in", tmp / "layer.out"
    M = x.shape[0]
    src.write_bytes(
        struct.pack(f"<{len(fields)}qq", *fields, M) + blobs + x.float().contiguous().numpy().tobytes()
    )
    return torch.from_numpy(np.frombuffer(qemu(binary, src, dst), dtype="<f4").copy()).reshape(M, N)


# -- integer weight-only ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def wint_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("neon") / "wint"
    return cross_build(out, MARCH["neon"], "prepared_harness.cpp", "wint_neon.cpp", "-DQRT_HARNESS_WINT")


WINT_CASES = [
    ("w4a16-int-g128-sym", 33, 256),
    ("w4a16-int-g32-asym", 20, 160),
    ("w4a16-int-g64-asym", 17, 192),
    ("w4a16-int-ch-sym", 24, 100),
    ("w4a16-int-g64-asym-actorder", 18, 256),
    ("w8a16-int-ch-sym", 33, 150),
    ("w8a16-int-g128-asym", 20, 256),
    ("w3a16-int-g128-asym", 19, 256),
    ("w3a16-int-g32-sym", 24, 224),
    ("w2a16-int-g64-sym", 33, 320),
    ("w2a16-int-g128-asym", 16, 384),
]


@pytest.mark.parametrize("scheme,N,K", WINT_CASES)
def test_wint_against_the_reference(wint_binary: Path, scheme: str, N: int, K: int, tmp_path: Path) -> None:
    """cpu.native_wint's prepared layout (the tensors an Arm machine's prepare makes), run by the NEON
    build on M = 1 and 6 rows, against the fp32 dequantize-then-matmul reference."""
    seed = int.from_bytes(os.urandom(4), "little")
    g = torch.Generator().manual_seed(seed)
    w = reference.quantize(
        torch.randn(N, K, generator=g) * 0.02, scheme, calib=torch.randn(16, K, generator=g)
    )
    lay = prepare_wint(w, LayerSpec(w.scheme, K, N), fn=lambda *a: 1)  # the layout only: no x86 library
    names = ("q", "scales", "zeros", "perm")
    arrays = [lay.tensors.get(n) for n in names]
    fields = list(lay.desc)
    for name, t in zip(names, arrays, strict=True):
        fields[WINT_FIELDS.index(name)] = 0 if t is None else t.numel() * t.element_size()
    blobs = b"".join(t.contiguous().numpy().tobytes() for t in arrays if t is not None)
    for M in (1, 6):
        x = torch.randn(M, K, generator=g)
        src, dst = tmp_path / "wint.in", tmp_path / "wint.out"
        src.write_bytes(
            struct.pack(f"<{len(fields)}qq", *fields, M) + blobs + x.contiguous().numpy().tobytes()
        )
        y = torch.from_numpy(np.frombuffer(qemu(wint_binary, src, dst), dtype="<f4").copy()).reshape(M, N)
        ref = reference.linear(x, w, out_dtype=torch.float32)
        err = float((y.double() - ref.double()).norm() / ref.double().norm())
        assert err < EXACT, f"{scheme} M={M} seed {seed}: {err:.3g}"


# -- code books and fp8 -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lut_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("neon") / "lut"
    return cross_build(out, MARCH["neon"], "prepared_harness.cpp", "lut_neon.cpp", "-DQRT_HARNESS_LUT")


LUT_CASES = [
    ("w4a16-nf4-g64", 33, 256),
    ("w4a16-nf4-g64-dq", 20, 512),
    ("w4a16-bnbfp4-g64", 17, 192),
    ("w4a16-nvfp4", 33, 160),
    ("w4a16-mxfp4", 19, 256),
    ("w8a16-fp8-tensor", 24, 100),
    ("w8a16-fp8-ch", 33, 150),
    ("w8a16-fp8-block128", 40, 256),
    ("w8a16-fp8e5m2-ch", 20, 96),
    ("w8a8-fp8-ch", 18, 128),
]


@pytest.mark.parametrize("scheme,N,K", LUT_CASES)
def test_lut_against_the_reference(lut_binary: Path, scheme: str, N: int, K: int, tmp_path: Path) -> None:
    """cpu.native_lut's prepared layout with the GEMV builds' fields, run by the NEON build on M = 1 and
    5 rows, against the fp32 reference (a W8A8 fp8 scheme's activations quantized by the layer's own
    step, as cpu.neon_lut's strategy does before the call)."""
    seed = int.from_bytes(os.urandom(4), "little")
    g = torch.Generator().manual_seed(seed)
    w = reference.quantize(
        torch.randn(N, K, generator=g) * 0.02, scheme, calib=torch.randn(16, K, generator=g)
    )
    lay = prepare_lut(w, LayerSpec(w.scheme, K, N), fn=lambda *a: 1, gemv=True)
    for M in (1, 5):
        x = torch.randn(M, K, generator=g)
        xq = lay.acts.apply(x) if lay.acts is not None else x
        y = run_prepared(lut_binary, lay, FIELDS + GEMV_FIELDS, ("q", "scales", "rowscale", "tab", "tab32"), xq, N,
                         tmp_path)  # fmt: skip
        ref = reference.linear(x, w, out_dtype=torch.float32)
        err = float((y.double() - ref.double()).norm() / ref.double().norm())
        assert err < EXACT, f"{scheme} M={M} seed {seed}: {err:.3g}"
