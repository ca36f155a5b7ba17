"""Compiling Triton kernels for sm_90 on a machine without a GPU (Triton's own ptxas), in a child
process: tests/triton runs interpreted (TRITON_INTERPRET=1) and a compile needs it unset. A test
module runs itself as the child (its ``__main__`` calls :func:`child_main`, or prints one JSON line
of its own) and its fixture reads what the child printed through :func:`results`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest


def results(script: str, timeout: int = 900) -> dict[str, Any]:
    """The JSON line ``script`` printed last, run without TRITON_INTERPRET; the test is skipped
    where the child finds no NVIDIA toolchain (exit status 3)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=timeout)
    if r.returncode == 3:
        pytest.skip(r.stdout.strip() or "no NVIDIA toolchain in this triton build")
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def require_triton() -> None:
    """Exit with status 3 where this triton build cannot compile for NVIDIA."""
    try:
        import triton  # noqa: F401
        from triton.backends.compiler import GPUTarget  # noqa: F401
    except ImportError as e:
        print(f"no triton: {e}")
        raise SystemExit(3) from None


def child_main(variants: dict[str, Any], compile_one: Callable[[Any], dict[str, Any]]) -> None:
    """Compile every variant and print one JSON line of its figures, or of its error (the innermost
    cause, which names the real one), so each test names its own failure."""
    require_triton()
    out: dict[str, Any] = {}
    for name, cx in variants.items():
        try:
            out[name] = compile_one(cx)
        except Exception as e:  # reported per variant
            out[name] = failure(e, out)
    print(json.dumps(out))


def failure(e: Exception, done: dict[str, Any]) -> dict[str, Any]:
    """A variant's error as its figures: the innermost cause, which names the real one. Exits with
    status 3 where the first compile finds no ptxas (the toolchain is missing, not the kernel wrong)."""
    if "ptxas" in str(e).lower() and not done:
        print(f"no ptxas: {str(e)[:200]}")
        raise SystemExit(3) from None
    root: BaseException = e
    while root.__cause__ is not None:
        root = root.__cause__
    return {"error": f"{type(root).__name__}: {str(root)[:1500]}"}
