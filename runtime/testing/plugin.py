"""The conformance kit's pytest plugin (entry point ``pytest11: quantrt``).

Options: ``--quantrt-seed S`` replays a run (every failure message names its seed), ``--quantrt-quick``
runs the quick case set in every :func:`quantrt.testing.conformance` test. The report header names
the seed; after the run, the terminal summary gives the cases passed, failed and skipped per kernel.
Under pytest-xdist the controller's seed is handed to every worker, so one seed covers the run.

A test module works without the plugin too (the seed is then drawn per process, and still printed
in each failure); the plugin only adds the options, the header and the summary.
"""

from __future__ import annotations

import fnmatch
import os
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pytest

#: the case parameter of a conformance test
PARAM = "quantrt_case"
#: environment variable read when the plugin is not loaded (or no --quantrt-seed is given)
SEED_ENV = "QUANTRT_TEST_SEED"


@dataclass
class Settings:
    """This process's run seed and quick flag (set by ``pytest_configure``)."""

    seed: int | None = None
    quick: bool = False
    configured: bool = False

    def run_seed(self) -> int:
        if self.seed is None:
            env = os.environ.get(SEED_ENV, "").strip()
            self.seed = int(env) if env.isdigit() else random.SystemRandom().randrange(1, 2**31)
        return self.seed


SETTINGS = Settings()


# -- the test factory ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadError:
    """A backend that failed to load: one failing test, not an empty run."""

    backend: str
    error: str


def conformance_test(
    backend: str | None = None,
    kernel: str | None = None,
    *,
    quick: bool | None = None,
    schemes: Iterable[Any] | None = None,
    registry: Any = None,
    xfail: Mapping[str, str] | None = None,
) -> Callable[..., None]:
    """The parametrized test behind :func:`quantrt.testing.conformance` (cases planned at collection)."""
    from .conformance import load_errors, plan, process_registry

    use_quick = SETTINGS.quick if quick is None else quick
    with process_registry(registry) as reg:
        errors = load_errors(reg, backend, kernel)
        cases = plan(backend, kernel, quick=use_quick, schemes=schemes, registry=reg)
    params = [pytest.param(LoadError(b, e), id=f"{b}-loads") for b, e in errors.items()]
    params += [pytest.param(c, id=c.id, marks=_marks(c, xfail or {})) for c in cases]
    if not params:
        what = f"backend {backend!r}" if backend else f"kernel {kernel!r}" if kernel else "any backend"
        params = [
            pytest.param(
                None,
                id="no-kernels",
                marks=pytest.mark.skip(reason=f"no kernel of {what} has a runnable device here"),
            )
        ]

    @pytest.mark.parametrize(PARAM, params)
    def test_conformance(quantrt_case: Any) -> None:
        """One conformance case: every check on one layer (the failure lists each failing check)."""
        from .conformance import FAILED, run_case

        if isinstance(quantrt_case, LoadError):
            pytest.fail(f"backend {quantrt_case.backend} failed to load: {quantrt_case.error}", pytrace=False)
        with process_registry(registry):
            result = run_case(quantrt_case, SETTINGS.run_seed())
        if result.status == FAILED:
            pytest.fail(result.failure_text() + f"\nreplay: --quantrt-seed {result.run_seed}", pytrace=False)

    return test_conformance


def _marks(case: Any, xfail: Mapping[str, str]) -> list[Any]:
    if case.skip:
        return [pytest.mark.skip(reason=case.skip)]
    for pattern, reason in xfail.items():
        if fnmatch.fnmatchcase(case.id, pattern):
            return [pytest.mark.xfail(reason=reason, strict=False)]
    return []


# -- hooks -----------------------------------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("quantrt", "quantrt kernel conformance")
    group.addoption(
        "--quantrt-seed",
        type=int,
        default=None,
        help=f"run seed of the conformance cases (default: ${SEED_ENV}, else a fresh one, printed)",
    )
    group.addoption(
        "--quantrt-quick",
        action="store_true",
        default=False,
        help="run the quick conformance case set (a few schemes per scheme family)",
    )


def pytest_configure(config: pytest.Config) -> None:
    worker = getattr(config, "workerinput", None)
    seed = config.getoption("quantrt_seed", None)
    if worker is not None and "quantrt_seed" in worker:
        seed = worker["quantrt_seed"]
    SETTINGS.seed = seed
    SETTINGS.quick = bool(config.getoption("quantrt_quick", False))
    SETTINGS.configured = True
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_XdistHooks(), "quantrt-xdist")


class _XdistHooks:
    """Hands the controller's seed to every xdist worker."""

    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput["quantrt_seed"] = SETTINGS.run_seed()


def pytest_report_header(config: pytest.Config) -> str:
    quick = ", quick case set" if SETTINGS.quick else ""
    return f"quantrt conformance: seed {SETTINGS.run_seed()}{quick} (replay with --quantrt-seed)"


def _case_of(item: pytest.Item) -> Any:
    callspec = getattr(item, "callspec", None)
    return None if callspec is None else callspec.params.get(PARAM)


def pytest_report_collectionfinish(config: pytest.Config, items: list[pytest.Item]) -> str | None:
    names = list(dict.fromkeys(c.kernel.name for c in map(_case_of, items) if hasattr(c, "kernel")))
    if not names:
        return None
    return f"quantrt conformance: kernels under test: {', '.join(names)} (seed {SETTINGS.run_seed()})"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tag each conformance test with its kernel, for the per-kernel summary (xdist sends it back)."""
    for item in items:
        case = _case_of(item)
        if hasattr(case, "kernel"):
            item.user_properties.append(("quantrt_kernel", case.kernel.name))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    rows: dict[str, dict[str, int]] = {}
    for key in ("passed", "failed", "skipped", "error", "xfailed", "xpassed"):
        for rep in terminalreporter.stats.get(key, []):
            props = dict(getattr(rep, "user_properties", []) or [])
            name = props.get("quantrt_kernel")
            if name is None or (key == "passed" and rep.when != "call"):
                continue
            status = {"error": "failed", "xpassed": "passed"}.get(key, key)
            rows.setdefault(name, {"passed": 0, "failed": 0, "skipped": 0, "xfailed": 0})[status] += 1
    if not rows:
        return
    tr = terminalreporter
    tr.section("quantrt conformance")
    width = max(len(n) for n in rows)
    tr.write_line(f"{'kernel':<{width}}  passed  failed  skipped  xfailed")
    for name, r in sorted(rows.items()):
        counts = f"{r['passed']:>6}  {r['failed']:>6}  {r['skipped']:>7}  {r['xfailed']:>7}"
        tr.write_line(f"{name:<{width}}  {counts}")
    tr.write_line(f"seed {SETTINGS.run_seed()} (replay with --quantrt-seed {SETTINGS.run_seed()})")
