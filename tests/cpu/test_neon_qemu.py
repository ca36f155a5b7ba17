"""The NEON build of the native GGUF kernel (native/csrc/gguf.cpp on aarch64), cross-compiled here and
run under qemu-aarch64 user emulation, against the independent integer reference (gguf_reference.py),
on small awkward shapes of every type: with the dot-product extension (SDOT) and without it.

Needs a cross compiler (g++-aarch64-linux-gnu) and qemu-user: ci/setup.sh installs both where it can
(Debian/Ubuntu as root) and sets QUANTRT_NEON_TESTS=1, which turns their absence into a failure."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf_reference import integer_reference

from quantrt.backends.cpu.gguf_native import TYPE_CODES
from quantrt.backends.cpu.native.build import CSRC
from quantrt.reference.gguf import random_blocks
from quantrt.schemes import GGUF_TYPES

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
HARNESS = Path(__file__).parent / "cross" / "gguf_harness.cpp"
#: -march levels: plain ARMv8 NEON (the widening-multiply path), and ARMv8.2 with SDOT
MARCH = {"neon": "armv8-a", "dotprod": "armv8.2-a+dotprod"}
EXACT = 1e-5


@pytest.fixture(scope="module", params=sorted(MARCH))
def binary(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("neon") / f"gguf-{request.param}"
    cmd = [
        CXX, f"-march={MARCH[request.param]}", "-O2", "-std=c++17", "-fopenmp", "-fno-math-errno", "-static",
        f"-I{CSRC}", str(HARNESS), str(CSRC / "gguf.cpp"), "-o", str(out),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def run(binary: Path, gtype: str, q: torch.Tensor, x: torch.Tensor, tmp: Path) -> tuple[int, torch.Tensor]:
    N, K, M = q.shape[0], x.shape[1], x.shape[0]
    src, dst = tmp / f"{gtype}.in", tmp / f"{gtype}.out"
    w = q.contiguous().numpy().tobytes()
    src.write_bytes(
        struct.pack("<iqqqq", TYPE_CODES[gtype], N, K, M, len(w))
        + w
        + x.float().contiguous().numpy().tobytes()
    )
    done = subprocess.run(
        [QEMU, "-L", str(SYSROOT), str(binary), str(src), str(dst)], capture_output=True, timeout=300
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    raw = dst.read_bytes()
    group = struct.unpack("<i", raw[:4])[0]
    return group, torch.from_numpy(np.frombuffer(raw[4:], dtype="<f4").copy()).reshape(M, N)


@pytest.mark.parametrize("gtype", sorted(GGUF_TYPES))
def test_every_type_against_the_integer_reference(binary: Path, gtype: str, tmp_path: Path) -> None:
    """Random bytes in every field (codes, scales, mins, signs) with finite f16 scales; N = 19 rows,
    3 blocks along K, M = 5 rows of x with outliers; the NEON build keeps every row canonical."""
    B = GGUF_TYPES[gtype][0]
    seed = int.from_bytes(os.urandom(4), "little")
    q = random_blocks(gtype, 19, 3 * B, seed)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(5, 3 * B, generator=g)
    x[:, torch.randint(0, 3 * B, (3,), generator=g)] *= 20
    x[2] = 0.0  # an all-zero activation row: zero scales, zero outputs
    group, y = run(binary, gtype, q, x, tmp_path)
    assert group == 0
    ref = integer_reference(x, q, gtype)
    assert not y[2].any()
    err = float((y.double() - ref).norm() / ref.norm())
    assert err < EXACT, f"{gtype} seed {seed}: {err:.3g}"
