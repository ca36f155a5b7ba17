"""The code decodes of the CUDA C++ TurboQuant decode (``backends/cuda/kernels/kv_tq_decode.cu``)
run on the CPU: the bodies of its ``key8`` and ``value2`` functions are read from the source and
executed statement by statement over an emulator of ``prmt``, ``lop3`` and ``__umulhi`` (tests/triton/
ptx_emulator.py, the ISA's definitions), on random code words, against the code book of
``quantrt.reference.turboquant`` and the codes themselves; and the host's launch rules.
tests/gpu/test_kv_mma.py runs the kernel."""

from __future__ import annotations

import re
from importlib import resources

import numpy as np
import pytest
import torch
from ptx_emulator import lop3, prmt

from quantrt.backends.cuda.kv_mma import (
    ARGS,
    MAX_SPLITS,
    STEPS_AHEAD,
    WARPS,
    key_tables,
    num_splits,
    planes_fit,
    shared_bytes,
    takes,
)
from quantrt.kv.pages import KVPages
from quantrt.reference.turboquant import codebook
from quantrt.schemes import parse_kv_scheme

M32 = 0xFFFFFFFF


def _body(name: str) -> list[str]:
    """The statements of device function ``name`` of the kernel source."""
    src = (resources.files("quantrt.backends.cuda") / "kernels" / "kv_tq_decode.cu").read_text()
    m = re.search(r"void " + name + r"\([^)]*\)\s*\{(.*?)\n\}", src, re.S)
    assert m, name
    code = re.sub(r"//[^\n]*", "", m.group(1))
    return [s.strip() for s in code.split(";") if s.strip()]


def _run(name: str, env: dict) -> dict:
    """Execute the function's statements (``const u32 x = ...`` and ``out[i] = ...``) in Python,
    every value cut to 32 bits."""
    env = dict(env, prmt=prmt, lop3=lop3, __umulhi=lambda a, b: (a * b) >> 32)
    for s in _body(name):
        s = re.sub(r"^const u32 ", "", s)
        s = re.sub(r"lop3<(0x[0-9A-Fa-f]+)>\(([^()]*(?:\([^()]*\)[^()]*)*)\)", r"lop3(\2, \1)", s)
        s = re.sub(r"(0x[0-9A-Fa-f]+|\d+)u\b", r"\1", s)
        target, expr = (x.strip() for x in s.split("=", 1))
        value = eval(expr, {}, env) & M32  # the repository's own source
        if target.startswith("out["):
            env["out"][int(target[4:-1])] = value
        else:
            env[target] = value
    return env


def _half(bits: int) -> float:
    return float(np.array([bits], dtype=np.uint16).view(np.float16)[0])


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_key8_gives_the_centroids(head_dim: int) -> None:
    centroids, _ = codebook(head_dim, 4)
    bits = tuple(b & 0xFFFF for b in centroids.to(torch.float16).view(torch.int16).tolist())
    tables = key_tables(bits)
    assert tables is not None
    lo, hi = tables
    rng = np.random.default_rng(head_dim)
    words = [int(w) for w in rng.integers(0, 2**32, 200, dtype=np.uint64)] + [0, M32, 0x76543210, 0xFEDCBA98]
    for r in words:
        env = _run(
            "key8", {"r": r, "l0": lo & M32, "l1": lo >> 32, "h0": hi & M32, "h1": hi >> 32, "out": [0] * 4}
        )
        for pair in range(4):
            for half in range(2):
                code = (r >> (4 * (2 * pair + half))) & 15
                got = (env["out"][pair] >> (16 * half)) & 0xFFFF
                assert got == bits[code], (hex(r), pair, half)


def test_value2_gives_the_codes_exactly() -> None:
    rng = np.random.default_rng(0)
    for a, b in rng.integers(0, 2**32, (200, 2), dtype=np.uint64):
        a, b = int(a), int(b)
        for j in range(4):
            env = _run("value2", {"a": a, "b": b, "j": j, "out": [0, 0]})
            for nib, scale in ((0, 2.0**-24), (1, 2.0**-20)):
                for half, word in enumerate((a, b)):
                    code = (word >> (8 * j + 4 * nib)) & 15
                    got = _half((env["out"][nib] >> (16 * half)) & 0xFFFF)
                    assert got == code * scale, (hex(a), hex(b), j, nib, half)


def test_key_tables_refuse_an_asymmetric_book() -> None:
    bits = list(range(0x3C00, 0x3C10))
    assert key_tables(tuple(bits)) is None


def test_small_calls_go_to_triton_and_splits_fill_the_gpu() -> None:
    """The host rules: below 2^18 (sequence, KV head, token) triples the portable kernel runs
    (its fixed cost is lower); splits fill four programs per SM, at most the combine's one round,
    each at least 128 tokens."""
    assert takes(1, 8, 32768) and takes(64, 8, 1024) and takes(16, 8, 8192)
    assert not takes(1, 8, 8192) and not takes(16, 8, 1024) and not takes(1, 1, 200000)
    assert num_splits(1, 8, 32768, 128, 132) == MAX_SPLITS
    assert num_splits(16, 8, 32768, 128, 132) == 4
    assert num_splits(64, 8, 32768, 128, 132) == 1
    assert num_splits(1, 8, 1024, 128, 132) == 8
    assert num_splits(1, 1, 32768, 256, 132) == MAX_SPLITS


def test_the_launcher_packs_as_many_arguments_as_the_kernel_takes() -> None:
    """``ARGS`` (the int64 slots the launcher packs) against the kernel's parameter list in the
    source: a parameter added on one side only would shift every later argument."""
    src = (resources.files("quantrt.backends.cuda") / "kernels" / "kv_tq_decode.cu").read_text()
    m = re.search(r"tq4_decode\((.*?)\)\s*\{", src, re.S)
    assert m
    params = [p for p in m.group(1).split(",") if p.strip()]
    assert len(params) == ARGS


def test_the_launch_reserves_the_rings_the_kernel_lays_out() -> None:
    """``shared_bytes`` is computed from the kernel's WARPS and STEPS_AHEAD, read here from the
    source: a deeper ring on one side only would overrun the launch's shared memory."""
    src = (resources.files("quantrt.backends.cuda") / "kernels" / "kv_tq_decode.cu").read_text()
    for name, value in (("WARPS", WARPS), ("STEPS_AHEAD", STEPS_AHEAD)):
        m = re.search(rf"constexpr int {name} = (\d+);", src)
        assert m and int(m.group(1)) == value, name
    assert shared_bytes(128) == 4 * 3 * 32 * 64  # the rings outgrow the merge's 4 x 32 x 33 floats


def test_planes_fit_takes_the_caches_layout_and_refuses_others() -> None:
    """Every cache's own planes fit; a misaligned key plane, code rows that are not contiguous
    and scalar planes of different strides do not (those calls go to the Triton kernel)."""
    scheme = parse_kv_scheme("kv-tq-4bit-nc")
    for d, heads in ((64, 1), (128, 8), (256, 2)):
        assert planes_fit(KVPages(scheme, 3, 16, heads, d).flat())
    flat = dict(KVPages(scheme, 3, 16, 2, 128).flat())
    assert planes_fit(flat)
    raw = torch.zeros(48 * 2 * 64 + 8, dtype=torch.uint8)
    assert not planes_fit({**flat, "k": raw[8:].view(48, 2, 64)})
    assert not planes_fit({**flat, "v": torch.zeros(48, 2, 128, dtype=torch.uint8)[..., ::2]})
    assert not planes_fit({**flat, "v_zero": torch.zeros(2, 48, dtype=torch.float16).t()})
