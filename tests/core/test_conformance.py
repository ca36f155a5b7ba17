"""The conformance kit (quantrt.testing) on the in-tree backends, and on broken kernels it must catch.

``test_in_tree`` is the kit's quick case set over every backend with a runnable device here (the CPU
kernels and the reference on the CI machine, the CUDA kernels too on a GPU machine); the full
catalog runs in ``quantrt verify``. The broken kernels below are each wrong in one way (an offset in
the output, NaNs dropped, noise per call, strides or ``out=`` ignored) and must fail exactly the
check that looks for it, while an exact kernel passes every check.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch

from quantrt import reference
from quantrt.cli import main
from quantrt.kernels import Kernel, Registry, check
from quantrt.prepared import ALL_M, Strategy
from quantrt.reference.kernel import ReferenceKernel
from quantrt.testing import conformance, plan, tolerance
from quantrt.testing.conformance import AWKWARD_N, FAILED, PASSED, kernels_under_test, process_registry, run

#: in-tree kernels the kit finds at fault (reported to their owners); each pattern is a case id
KNOWN: dict[str, str] = {}  # case-id patterns expected to fail, with why (none today)

test_in_tree = conformance(quick=True, xfail=KNOWN)


# -- broken kernels --------------------------------------------------------------------------------

SCHEME = "w8a16-int-ch-sym"


@dataclass(frozen=True)
class Dense:
    w: torch.Tensor  # fp32 [N, K], the exact dequantized weight
    out_dtype: torch.dtype


def exact(lay: Dense, x, bias, out, ws):
    y = x.float() @ lay.w.T
    if bias is not None:
        y = y + bias.float()
    return out.copy_(y) if out is not None else y.to(lay.out_dtype)


def offset(lay, x, bias, out, ws):
    return (
        exact(lay, x, bias, None, ws).add_(1e-2) if out is None else exact(lay, x, bias, out, ws).add_(1e-2)
    )


def drops_nans(lay, x, bias, out, ws):
    y = exact(lay, x, bias, out, ws)
    return torch.nan_to_num_(y, nan=0.0, posinf=0.0, neginf=0.0)


def noisy(lay, x, bias, out, ws):
    y = exact(lay, x, bias, out, ws)
    return y.add_(torch.randn(y.shape, dtype=y.dtype) * 1e-7)


def ignores_strides(lay, x, bias, out, ws):
    return exact(lay, torch.as_strided(x, x.shape, (x.shape[1], 1)), bias, out, ws)


def ignores_out(lay, x, bias, out, ws):
    return exact(lay, x, bias, None, ws)


def make_kernel(name: str, fn) -> type[Kernel]:
    """A kernel for one scheme, fp32 activations, whose one strategy is ``fn``."""

    def can_implement(cls, spec, caps):
        return check((spec.scheme.name == SCHEME, f"scheme {SCHEME}", {"scheme": spec.scheme.name}))

    def prepare(self, weight, spec):
        lay = Dense(reference.dequantize(weight), spec.output_dtype)
        return self.prepared(lay, [Strategy(ALL_M, fn.__name__, fn)], spec, lay.w.device)

    body = {"name": name, "act_dtypes": (torch.float32,), "can_implement": classmethod(can_implement)}
    return type(name.replace(".", "_"), (Kernel,), {**body, "prepare": prepare})


BROKEN = {
    f.__name__: make_kernel(f"broken.{f.__name__}", f)
    for f in (exact, offset, drops_nans, noisy, ignores_strides, ignores_out)
}


@pytest.fixture(scope="module")
def broken() -> Registry:
    reg = Registry()
    reg.set_fallback(ReferenceKernel, "reference")
    reg.backends["broken"] = "tests/core/test_conformance.py"
    reg.register_ordered(list(BROKEN.values()), device_kind="cpu", backend="broken")
    return reg


def failing(report, kernel: str) -> set[str]:
    return {c.name for r in report.results if r.case.kernel.name == kernel for c in r.failures}


def run_broken(reg: Registry, seed: int, kernel: str | None = None, compile_exact: bool = False):
    """The broken backend's cases (full plan of one scheme); torch.compile only where asked for."""
    with process_registry(reg):
        cases = plan("broken", kernel, schemes=[SCHEME], registry=reg)
        cases = [
            replace(c, compile=c.compile and compile_exact and c.kernel is BROKEN["exact"]) for c in cases
        ]
        return run(cases, seed, registry=reg)


def test_broken_kernels_fail_the_check_that_looks_for_them(broken: Registry) -> None:
    report = run_broken(broken, 11, compile_exact=True)
    assert not report.ok
    by_kernel = {row["kernel"]: row for row in report.summary()}
    assert set(by_kernel) == {k.name for k in BROKEN.values()}
    assert by_kernel["broken.exact"][FAILED] == 0 and by_kernel["broken.exact"][PASSED] == 4
    off = failing(report, "broken.offset")
    assert {"M=1", "M=3 strided x", "M=5 out= column window"} <= off and "determinism" not in off
    assert failing(report, "broken.drops_nans") == {"nonfinite"}
    assert failing(report, "broken.noisy") == {"determinism"}
    assert {"M=3 strided x", "M=17 row-padded x, out="} <= failing(report, "broken.ignores_strides")
    assert failing(report, "broken.ignores_out") == {"M=17 row-padded x, out=", "M=5 out= column window"}
    compiled = [c for r in report.results for c in r.checks if c.name == "compile"]
    assert len(compiled) == 1 and compiled[0].ok


def test_failure_names_kernel_scheme_shape_dtype_check_and_errors(broken: Registry) -> None:
    report = run_broken(broken, 5, "broken.offset")
    r = next(r for r in report.results if r.status == FAILED)
    text = r.failure_text()
    c = r.case
    for part in ("broken.offset", SCHEME, f"K={c.K} N={c.N}", "fp32", "check M=1 failed", "> allowed 0.0001"):
        assert part in text, (part, text)
    assert f"run seed 5, case seed {r.seed}" in text


def test_same_seed_same_draws_other_seed_fresh_ones(broken: Registry) -> None:
    def errors(seed: int) -> list[float]:
        return [
            c.error
            for r in run_broken(broken, seed, "broken.offset").results
            for c in r.checks
            if c.name == "M=1"
        ]

    a = errors(7)
    assert a == errors(7) and a != errors(8)


def test_tolerances_by_dtype_and_declared_activation_quantization() -> None:
    k = BROKEN["exact"]
    assert tolerance(k, torch.float32) == 1e-4
    assert tolerance(k, torch.float16) == 1e-2 and tolerance(k, torch.bfloat16) == 1.6e-2
    assert tolerance(k, torch.float32, torch.bfloat16) == 1.6e-2  # out= of a coarser dtype

    class Act8(Kernel):
        name = "act8"
        quantizes_activations = True

    assert tolerance(Act8, torch.float32) == 2e-2 == tolerance(Act8, torch.bfloat16)


def test_quick_plan_covers_every_kernel_family_and_awkward_shape() -> None:
    quick, full = plan(quick=True), plan()
    kernels = {k.name for k, _ in kernels_under_test()}
    assert {c.kernel.name for c in quick} == kernels == {c.kernel.name for c in full}
    for name in kernels:
        fams = {c.scheme.family for c in full if c.kernel.name == name and c.K}
        mine = [c for c in quick if c.kernel.name == name]
        assert fams == {c.scheme.family for c in mine if c.K}, name
        for fam in fams:
            widths = {c.N for c in mine if c.scheme.family == fam}
            assert set(AWKWARD_N) <= widths, (name, fam, widths)
    assert len(quick) < len(full)
    assert sum(c.compile for c in quick) == len({(c.kernel.name, c.device_name) for c in quick if not c.skip})


def test_refused_shapes_are_skipped_with_the_verdict() -> None:
    cases = plan(backend="cpu")
    skipped = [c for c in cases if c.skip]
    for c in skipped:
        # a refused shape or dtype names its predicate; a kernel refused whole (no AMX tiles here,
        # say) lists its predicates after saying so
        reason = c.skip.removeprefix("implements no scheme of the catalog on this device: ")
        assert reason.startswith("requires"), c.skip
        assert not c.kernel.supports(c.spec(), c.device)


def test_verify_command(broken: Registry, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    assert (
        main(
            ["verify", "--backend", "reference", "--scheme", "gguf-q4_0", "--quick", "--seed", "3", "--json"]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] and doc["seed"] == 3 and doc["summary"][0]["kernel"] == "reference"
    assert {c["status"] for c in doc["cases"]} == {PASSED} and all(c["checks"] for c in doc["cases"])
    monkeypatch.setattr("quantrt.kernels._REGISTRY", broken)
    assert main(["verify", "--kernel", "broken.drops_nans", "--scheme", SCHEME, "--seed", "3"]) == 1
    out, err = capsys.readouterr()
    assert "broken.drops_nans" in out and "passed  failed  skipped" in out and "seed 3" in out
    assert "check nonfinite failed" in err and "replay with --seed 3" in err
    assert main(["verify", "--backend", "nonesuch"]) == 1
    assert "no backend 'nonesuch'" in capsys.readouterr().err


PLUGIN_TEST = """
from quantrt.testing import conformance

test_ref = conformance(backend="reference", schemes=["w8a16-int-ch-sym"])
"""


def test_pytest_plugin_runs_cases_with_one_seed(tmp_path: Path) -> None:
    (tmp_path / "test_kit.py").write_text(textwrap.dedent(PLUGIN_TEST))
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUANTRT_")}
    # the installed entry point loads the plugin; a checkout installed before it existed names it
    installed = any(ep.name == "quantrt" for ep in importlib.metadata.entry_points(group="pytest11"))
    load = [] if installed else ["-p", "quantrt.testing.plugin"]
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            *load,
            "-rs",
            "--quantrt-seed",
            "42",
            "--quantrt-quick",
            "-p",
            "no:cacheprovider",
            "test_kit.py",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "quantrt conformance: seed 42, quick case set" in out.stdout
    assert "kernels under test: reference" in out.stdout
    assert "reference  " in out.stdout and "seed 42 (replay with --quantrt-seed 42)" in out.stdout
    assert " passed" in out.stdout
