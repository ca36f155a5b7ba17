"""Every Triton launch AMD's kernel classes make, compiled for MI300 (gfx942) and MI350 (gfx950) on
the CPU: there is no AMD GPU here, and the interpreter the other tests run cannot see what only
the AMD compiler rejects (NVIDIA-only intrinsics, fp8 flavours an architecture lacks, warp-size
assumptions, options the AMD backend refuses), nor represent MI300's e4m3fnuz at all.

Each ``backends/rocm/triton_kernels.py`` class, pinned to one architecture, prepares a small
layer of a representative scheme and applies it at the batch sizes that reach each of its
strategies, with :class:`~quantrt.backends.triton.launch.Launcher` (every launch of these kernels
goes through it) patched to compile instead of launch: Triton's own binder and ``run`` path
specialise the real arguments for a HIP target (dtypes, 16-byte alignment, buffer-op pointer
ranges, constexprs, ``num_warps``/``num_stages``), as they would on the GPU. Nothing runs, so the
outputs hold garbage; only the compiles are checked. tests/triton runs interpreted, so the sweep
runs in child processes without TRITON_INTERPRET (this file as a script), one per architecture.
LLVM ends the process on some errors (inline PTX constraints: ``exit(1)`` with one line on stderr),
so a child notes the launch it is compiling; after such an end the parent records that launch as
failed and runs the child again, which then skips it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

#: architecture -> the capability preset of its GPU (whose can_implement verdicts excuse a failure)
ARCHS = {"gfx942": "mi300x", "gfx950": "mi355x"}
#: LDS bytes a workgroup may use: Triton checks a kernel's shared memory against it only when the
#: GPU loads the binary (OutOfResources), so the compiles here check it
LDS = {"gfx942": 64 << 10, "gfx950": 160 << 10}
#: (class in backends/rocm/triton_kernels.py, scheme, K, N): one layer per scheme family; K a
#: multiple of 256 (GGUF k-quants) except the ragged fp8 layer (masked K tails)
CASES = [
    ("RocmTritonW4A16", "w4a16-int-g128-asym", 512, 256),
    ("RocmTritonW8A16", "w8a16-int-ch-sym", 512, 256),
    ("RocmTritonFp4", "w4a16-nvfp4", 512, 256),
    ("RocmTritonFp4", "w4a16-mxfp4", 512, 256),
    ("RocmTritonBnb4", "w4a16-nf4-g64", 512, 256),
    ("RocmTritonGGUF", "gguf-q4_k", 512, 256),
    ("RocmTritonGGUF", "gguf-q6_k", 512, 256),
    ("RocmTritonGGUF", "gguf-q8_0", 512, 256),
    ("RocmTritonGGUF", "gguf-q5_0", 512, 256),
    ("RocmTritonFp8", "w8a8-fp8-ch", 512, 256),
    ("RocmTritonFp8", "w8a8-fp8-ch", 200, 72),
    ("RocmTritonFp8", "w8a8-fp8-tensor-dyn", 512, 256),
    ("RocmTritonFp8", "w8a8-fp8-tensor-static", 512, 256),
    ("RocmTritonBlockFp8", "w8a8-fp8-block128", 512, 256),
    ("RocmTritonFp8WeightOnly", "w8a16-fp8-ch", 512, 256),
    ("RocmTritonInt8", "w8a8-int-ch-sym", 512, 256),
    ("RocmTritonInt8", "w8a8-int-ch-sym-static", 512, 256),
]
#: GGUF layers under a table that enables the fused GEMM (AMD's tables do not yet): what a tuned
#: gguf_<gfx>.json would launch
GEMM_CASES = [("RocmTritonGGUF", "gguf-q4_k", 512, 256), ("RocmTritonGGUF", "gguf-q8_0", 512, 256)]
ACTS = ("float16", "bfloat16")
#: batch sizes every layer runs besides the first of each strategy (M = 1 is its own
#: specialisation; multiples of 16 are specialised as divisible)
BATCHES = (1, 16, 128)
#: the kernels the sweep must reach on each architecture (every family's launches)
EXPECTED = {
    "_w4a16_kernel", "_w4_gemv_kernel", "_lut4_gemv_kernel", "_lut4_tile_kernel", "_lut4_dequant_kernel",
    "_gguf_gemv_kernel", "_gguf_dequant_kernel", "_per_token_kernel", "_per_group_kernel", "_amax_kernel",
    "_per_tensor_kernel", "_fp8_rowwise_kernel", "_fp8_block_kernel", "_fp8_wo_kernel", "_int8_mm_kernel",
    "_gguf_gemm_kernel",
}  # fmt: skip
FP8_GEMMS = ("_fp8_rowwise_kernel", "_fp8_block_kernel")
#: the kernels built on ``tl.dot``: each compile must reach the matrix cores (MFMA), in the operand
#: type the kernel multiplies (an fp8 or int8 dot upcast to fp16 compiles too, slowly)
DOTS = {
    "_w4a16_kernel": "f16|bf16", "_lut4_tile_kernel": "f16|bf16", "_fp8_wo_kernel": "f16|bf16",
    "_gguf_gemm_kernel": "f16|bf16", "_fp8_rowwise_kernel": "fp8|f8f6f4", "_fp8_block_kernel": "fp8|f8f6f4",
    "_int8_mm_kernel": "i8",
}  # fmt: skip
#: times the parent runs a child again after the compiler ended it
RESTARTS = 20


def _case_id(cls: str, scheme: str, K: int, N: int, act: str, gemm_table: bool) -> str:
    return f"{cls}:{scheme}:K{K}:N{N}:{act}" + (":gemm-table" if gemm_table else "")


# -- the child: compile instead of launch ---------------------------------------------------------


class _HipTarget:
    """Triton's active driver, answering for an AMD GPU that is not there: the current device is the
    architecture's name (Triton keys its per-device binders and caches on it), and its target a
    wavefront-64 HIP GPU of that architecture."""

    def __init__(self, arch: str) -> None:
        self.arch = arch

    def get_current_device(self) -> str:
        return self.arch

    def get_current_stream(self, device: Any = None) -> int:
        return 0

    def get_current_target(self) -> Any:
        from triton.backends.compiler import GPUTarget

        return GPUTarget("hip", self.arch, 64)


@contextmanager
def _fd2_to(path: Path):
    """The C++ side (MLIR, LLVM) reports its diagnostics on file descriptor 2, not through the
    Python exception: send them to ``path`` (read for the failure's message, also after LLVM has
    ended the process)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with path.open("wb") as f:
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


class _Sweep:
    """Compiles each distinct launch once (Triton's own specialisation key), noting which layers
    made it. ``work``: the folder shared with the parent (``fatal.json`` in, ``current.json`` and
    ``fd2.txt`` out)."""

    def __init__(self, arch: str, work: Path) -> None:
        self.arch = arch
        self.work = work
        fatal = work / "fatal.json"
        self.fatal: dict[str, str] = json.loads(fatal.read_text()) if fatal.exists() else {}
        self.case = ""
        self.kernels: dict[str, dict[str, Any]] = {}
        self.launches = 0

    def launch(self, fn: Any, grid: tuple, args: tuple, meta: dict[str, Any]) -> None:
        self.launches += 1
        binder = fn.device_caches[self.arch][4]
        _, spec, options = binder(*args, **meta)
        key = f"{fn.__name__}|{spec!r}|{sorted(options.items())!r}"
        got = self.kernels.get(key)
        if got is None:
            got = self.kernels[key] = self._compile(key, fn, grid, args, meta, spec)
        if self.case not in got["cases"]:
            got["cases"].append(self.case)

    def _compile(self, key: str, fn: Any, grid: tuple, args: tuple, meta: dict, spec: list) -> dict[str, Any]:
        names = [p.name for p in fn.params]
        sig = {n: s[0] for n, s in zip(names, spec) if s[0] != "constexpr"}
        consts = {n: repr(s[1]) for n, s in zip(names, spec) if s[0] == "constexpr"}
        rec: dict[str, Any] = {"kernel": fn.__name__, "signature": sig, "constexprs": consts, "cases": []}
        rec["options"] = {k: meta[k] for k in ("num_warps", "num_stages") if k in meta}
        if key in self.fatal:  # it ended an earlier run of this sweep
            return {**rec, "error": self.fatal[key]}
        current, diag = self.work / "current.json", self.work / "fd2.txt"
        current.write_text(json.dumps({"key": key, "case": self.case, **rec}))
        try:
            with _fd2_to(diag):
                compiled = fn.run(*args, grid=grid, warmup=True, **meta)
        except Exception as e:  # recorded per launch; the tests name the failure
            root = e
            while root.__cause__ is not None:  # the innermost error names the real cause
                root = root.__cause__
            rec["error"] = f"{type(root).__name__}: {str(root)[-2500:]}\n{_tail(diag)}"
            return rec
        finally:
            current.unlink()
        asm = compiled.asm["amdgcn"]
        mfma = sorted(set(re.findall(r"\bv_mfma_\w+", asm)))
        spills = sum(int(n) for n in re.findall(r"\.[sv]gpr_spill_count:\s*(\d+)", asm))
        return {**rec, "ok": True, "mfma": mfma, "lds": compiled.metadata.shared, "spills": spills}


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-2500:] if path.exists() else ""


def _batches(strategies: Any) -> list[int]:
    """:data:`BATCHES` and the smallest batch each strategy serves."""
    starts = [1] + [s.max_m + 1 for s in strategies[:-1]]
    return sorted({*BATCHES, *starts})


def _gemm_policy(arch: str) -> Any:
    """AMD's policy with sm_90's fused-GEMM section in its GGUF table (two pipeline stages, as
    AMD's tables use)."""
    from quantrt.backends.rocm.policy import RocmPolicy, arch_target
    from quantrt.backends.triton import tile_table

    cuda = tile_table.load("quantrt.backends.cuda", "gguf", "sm_90")
    tiles = {
        t: {b: {**c, "num_stages": min(2, c["num_stages"])} for b, c in rows.items()}
        for t, rows in cuda["gemm_types"].items()
    }

    class GemmTablePolicy(RocmPolicy):
        def table(self, name: str, target: Any) -> dict[str, Any]:
            doc = super().table(name, target)
            if name != "gguf":
                return doc
            return {**doc, "gemm_types": tiles, "gemm_max_m": cuda["gemm_max_m"]}

    return GemmTablePolicy(arch_target(arch))


def _run_case(sweep: _Sweep, arch: str, case: tuple, act_name: str, gemm_table: bool) -> dict[str, Any]:
    """Prepare one layer with the class pinned to ``arch`` and apply it at every batch of
    :func:`_batches`; the verdict of the architecture's preset comes along."""
    import torch

    from quantrt import reference
    from quantrt.backends.rocm import triton_kernels
    from quantrt.backends.rocm.policy import RocmPolicy, arch_target
    from quantrt.backends.triton.vendor import specialise
    from quantrt.capability import load_preset
    from quantrt.plans import layer_spec

    cls_name, scheme, K, N = case
    act = getattr(torch, act_name)
    policy = _gemm_policy(arch) if gemm_table else RocmPolicy(arch_target(arch))
    (kernel,) = specialise(policy, getattr(triton_kernels, cls_name))
    g = torch.Generator().manual_seed(K + N)
    w = torch.randn(N, K, generator=g) * 0.05
    calib = torch.randn(16, K, generator=g) * 2
    canon = reference.quantize(w, scheme, calib=calib if "static" in scheme else None)
    spec = layer_spec(scheme, K, N, act_dtype=act, bias=True)
    verdict = kernel.supports(spec, load_preset(ARCHS[arch]).default_device)
    out: dict[str, Any] = {"supported": verdict.ok, "reason": "" if verdict.ok else str(verdict)}
    sweep.case = _case_id(*case, act_name, gemm_table)
    before = sweep.launches
    try:
        k = kernel()
        state = k.prepare(canon, spec)
        bias = torch.randn(N, generator=g).to(act)
        ms = _batches(state.strategies)
        for m in ms:
            k.apply(state, torch.randn(m, K, generator=g).to(act), bias)
        out["strategies"] = {m: k.strategy(state, m) for m in ms}
    except Exception as e:  # a failure outside the compiles (prepare, host code): reported as is
        out["error"] = f"{type(e).__name__}: {e}"
    out["launches"] = sweep.launches - before
    return out


def _child(arch: str, work: Path) -> None:
    """Sweep every case for ``arch``; print one JSON line (exit 3: no AMD backend in this Triton)."""
    try:
        from triton.backends import backends
        from triton.runtime.driver import driver
    except ImportError as e:
        print(f"no triton: {e}")
        raise SystemExit(3) from None
    if "amd" not in backends:
        print("this Triton build has no AMD backend")
        raise SystemExit(3)
    from quantrt.backends.triton.launch import Launcher

    driver.set_active(_HipTarget(arch))
    sweep = _Sweep(arch, work)
    Launcher.__call__ = lambda self, grid, *args, **meta: sweep.launch(self.fn, grid, args, meta)
    cases = {}
    for gemm_table, group in ((False, CASES), (True, GEMM_CASES)):
        for case in group:
            for act in ACTS:
                cases[_case_id(*case, act, gemm_table)] = _run_case(sweep, arch, case, act, gemm_table)
    print(json.dumps({"cases": cases, "kernels": list(sweep.kernels.values())}))


# -- the parent: one child per architecture, the assertions ----------------------------------------


def _sweep_child(arch: str) -> tuple[int, str]:
    """A child's exit status and output for ``arch``; where the compiler ended it, the launch it was
    compiling is recorded as failed (``fatal.json``) and the child runs again without it."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        fatal: dict[str, str] = {}
        for _ in range(RESTARTS):
            (work / "fatal.json").write_text(json.dumps(fatal))
            r = subprocess.run(
                [sys.executable, __file__, arch, tmp], env=env, capture_output=True, text=True, timeout=1200
            )
            current = work / "current.json"
            if r.returncode in (0, 3) or not current.exists():
                return r.returncode, r.stdout if r.returncode in (0, 3) else r.stdout + r.stderr[-3000:]
            launch = json.loads(current.read_text())
            current.unlink()
            fatal[launch["key"]] = (
                f"the compiler ended the process (exit {r.returncode}): {_tail(work / 'fd2.txt')}"
            )
        return 1, f"the compiler ended {RESTARTS} runs; last: {launch}"


@pytest.fixture(scope="module")
def sweeps() -> dict[str, dict[str, Any]]:
    """Each architecture's cases and compiled kernels, from two child processes run side by side."""
    with ThreadPoolExecutor(len(ARCHS)) as pool:
        runs = dict(zip(ARCHS, pool.map(_sweep_child, ARCHS)))
    out = {}
    for arch, (rc, text) in runs.items():
        if rc == 3:
            pytest.skip(text.strip() or "no AMD backend in this triton build")
        assert rc == 0, f"{arch}: {text[-3000:]}"
        out[arch] = json.loads(text.strip().splitlines()[-1])
    return out


@pytest.mark.parametrize("arch", list(ARCHS))
def test_every_layer_ran(sweeps: dict, arch: str) -> None:
    """Every layer prepared and applied without a host-side error and launched kernels; together
    they reached every kernel family."""
    cases = sweeps[arch]["cases"]
    assert {c: v["error"] for c, v in cases.items() if "error" in v} == {}
    assert [c for c, v in cases.items() if not v["launches"]] == []
    assert EXPECTED <= {k["kernel"] for k in sweeps[arch]["kernels"]}


@pytest.mark.parametrize("arch", list(ARCHS))
def test_every_launch_compiles(sweeps: dict, arch: str) -> None:
    """Every distinct launch compiled for the architecture, unless every layer that made it is one
    its class's can_implement refuses on that GPU."""
    cases = sweeps[arch]["cases"]
    failed = [
        f"{k['kernel']} {k['signature']} {k['constexprs']} {k['options']} (layers {k['cases']}):\n{k['error']}"
        for k in sweeps[arch]["kernels"]
        if "error" in k and any(cases[c]["supported"] for c in k["cases"])
    ]
    assert not failed, "\n\n".join(failed)


def test_fp8_gemms_in_each_flavour(sweeps: dict) -> None:
    """MI300 multiplies e4m3fnuz codes (Triton's fp8e4b8) and MI350 OCP e4m3 (fp8e4nv): each arch
    compiles the other flavour too, upcast to fp16 dots (MI300 has no OCP fp8 MFMA, MI350 deprecates
    fnuz), so the flavour is checked, not just the compile."""
    for arch, flavour, other in (("gfx942", "*fp8e4b8", "*fp8e4nv"), ("gfx950", "*fp8e4nv", "*fp8e4b8")):
        gemms = [k for k in sweeps[arch]["kernels"] if k["kernel"] in FP8_GEMMS and k.get("ok")]
        assert {k["kernel"] for k in gemms} == set(FP8_GEMMS), arch
        for k in gemms:
            operands = {k["signature"][p] for p in ("X", "W")}
            assert operands == {flavour}, (arch, k["kernel"], k["signature"])
        assert not [k for k in sweeps[arch]["kernels"] if other in k["signature"].values()], arch


@pytest.mark.parametrize("arch", list(ARCHS))
def test_dots_on_matrix_cores(sweeps: dict, arch: str) -> None:
    """Every compile of a ``tl.dot`` kernel has an MFMA instruction of its operand type (fp8 and
    int8 dots not widened to fp16)."""
    wrong = [
        (k["kernel"], k["signature"], k["constexprs"], k["mfma"])
        for k in sweeps[arch]["kernels"]
        if k["kernel"] in DOTS and k.get("ok")
        and not any(re.search(rf"_(?:{DOTS[k['kernel']]})(?:_|$)", m) for m in k["mfma"])
    ]  # fmt: skip
    assert not wrong, wrong


@pytest.mark.parametrize("arch", list(ARCHS))
def test_lds_fits(sweeps: dict, arch: str) -> None:
    """Every compile's shared memory fits the architecture's LDS (a launch would fail otherwise)."""
    over = [
        (k["kernel"], k["constexprs"], k["lds"])
        for k in sweeps[arch]["kernels"]
        if k.get("lds", 0) > LDS[arch]
    ]
    assert not over, over


def test_report(sweeps: dict) -> None:
    """Per architecture: distinct compiles, kernels, MFMA instructions, register spills (``pytest -s``
    shows it; spills cost speed, not correctness, so they are reported, not asserted)."""
    for arch, sweep in sweeps.items():
        kernels = sweep["kernels"]
        ok = [k for k in kernels if k.get("ok")]
        names = sorted({k["kernel"] for k in kernels})
        mfma = sorted({m for k in ok for m in k["mfma"]})
        spilled: dict[str, list[int]] = {}
        for k in ok:
            if k["spills"]:
                spilled.setdefault(k["kernel"], []).append(k["spills"])
        spills = [f"{n} in {len(v)} compiles, up to {max(v)}" for n, v in sorted(spilled.items())]
        refused = sorted(c for c, v in sweep["cases"].items() if not v["supported"])
        print(
            f"\n{arch}: {len(ok)}/{len(kernels)} distinct launches compiled, {len(names)} kernels "
            f"({', '.join(names)}); MFMA: {', '.join(mfma)}; spilled registers: {', '.join(spills) or 'none'}; "
            f"layers can_implement refuses: {', '.join(refused) or 'none'}"
        )
        assert ok


if __name__ == "__main__":
    _child(sys.argv[1], Path(sys.argv[2]))
