"""The conformance kit: any backend's kernels, checked against the reference the way quantrt's own are.

In a backend package's tests (one test id per case, skipped cases with their reasons)::

    from quantrt.testing import conformance

    test_conformance = conformance(backend="acme")

From the command line: ``quantrt verify --backend acme``. Programmatically: :func:`verify`, or
:func:`plan` then :func:`run`. docs/conformance.md lists the cases, the checks and the tolerances.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

# the engine module is imported before the function of the same name below is defined, so that the
# package attribute ``conformance`` is the function (a submodule binds its name only when first loaded)
from .conformance import (
    EXACT_ACTIVATIONS,
    QUANTIZED_ACTIVATIONS,
    Case,
    CaseResult,
    Check,
    Report,
    kernels_under_test,
    plan,
    run,
    run_case,
    tolerance,
    verify,
)

__all__ = [
    "EXACT_ACTIVATIONS",
    "QUANTIZED_ACTIVATIONS",
    "Case",
    "CaseResult",
    "Check",
    "Report",
    "conformance",
    "kernels_under_test",
    "plan",
    "run",
    "run_case",
    "tolerance",
    "verify",
]


def conformance(
    backend: str | None = None,
    kernel: str | None = None,
    *,
    quick: bool | None = None,
    schemes: Iterable[Any] | None = None,
    registry: Any = None,
    xfail: Mapping[str, str] | None = None,
) -> Callable[..., None]:
    """A parametrized pytest test running the kit on one backend (or kernel, or every backend with a
    runnable device here): assign it to a ``test_*`` name in a test module.

    ``quick=None`` follows ``--quantrt-quick``; ``schemes`` narrows the catalog; ``xfail`` maps case-id
    patterns (fnmatch) to the reason they are known to fail.
    """
    from .plugin import conformance_test  # pytest is needed only here, not by `quantrt verify`

    return conformance_test(backend, kernel, quick=quick, schemes=schemes, registry=registry, xfail=xfail)
