"""The conformance engine: every registered kernel, on every runnable device of its kind, against the
fp32 reference, through the path a model takes (``reference.quantize`` -> ``QuantLinear.from_canonical``
with the kernel forced, as ``QUANTRT_KERNEL`` forces it).

:func:`plan` lists the cases (a kernel, a device, a scheme, an activation dtype and a shape ``K x N``,
with or without bias), asking each kernel's ``supports`` first: a kernel that refuses a shape or a
dtype gives a skipped case carrying its verdict's reason; a scheme the kernel never implements here
gives no case at all. :func:`run_case` builds the layer once and runs the checks on it:

- ``build``: the forced kernel is the one that runs the layer;
- ``M=<m>`` accuracy: batches of 0, 1, 3 and 17 rows and the first rows of every strategy, with a
  strided ``x``, a row-padded ``x``, ``out=`` given, ``out=`` of another dtype and ``out=`` a column
  window of a wider buffer; relative Frobenius error (DESIGN.md's metric, float64) below
  :func:`tolerance`, output shape, dtype and device as declared;
- ``nonfinite``: a NaN and infinities in some rows give non-finite outputs exactly where the
  reference has them (those rows; every row when the scheme quantizes activations per tensor), the
  other rows finite and close;
- ``determinism``: two calls on the same input are bitwise equal;
- ``compile`` (one case per kernel and device): ``torch.compile(fullgraph=True)`` of a function
  calling the layer equals eager;
- ``cuda-graph`` (devices torch runs as ``cuda``): one call captured, replayed on new data copied
  into the static input, equals eager.

Every draw comes from a generator seeded by the run seed and the case's id, so
``quantrt verify --seed S`` (or ``pytest --quantrt-seed S``) replays a failure exactly.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from .. import kernels as _kernels
from ..capability import Capabilities, DeviceCaps, probe
from ..errors import ConfigError
from ..kernels import Kernel, Registry, Verdict
from ..schemes import GGUF_TYPES, Scheme, catalog, parse_scheme
from ..specs import LayerSpec

FP32, BF16, FP16 = torch.float32, torch.bfloat16, torch.float16
#: activation dtypes the kit runs, in this order, where a kernel declares them
DTYPES: tuple[torch.dtype, ...] = (FP32, BF16, FP16)
DTYPE_NAMES = {FP32: "fp32", BF16: "bf16", FP16: "fp16"}

#: relative Frobenius error allowed against the fp32 reference, by activation (and output) dtype, for
#: kernels that keep the scheme's activations as given: the loosest bound the in-tree kernel tests
#: hold a kernel to at that dtype (fp32: a bnb code book split into bf16 value and residual,
#: tests/cpu/test_lut_native.py; fp16: DESIGN.md's bound for 16-bit outputs, tests/cpu/*; bf16: a
#: decoded tile rounded to bf16 once, tests/triton/test_gguf_gemm.py)
EXACT_ACTIVATIONS: dict[torch.dtype, float] = {FP32: 1e-4, FP16: 1e-2, BF16: 1.6e-2}
#: kernels declaring ``quantizes_activations`` (8-bit activation blocks for a weight-only scheme, as
#: llama.cpp does): the bound of those blocks at any dtype (tests/cpu/test_amx.py)
QUANTIZED_ACTIVATIONS = 2e-2

#: the batch sizes every case runs (M=0 is Prepared's and QuantLinear's, the others the kernel's)
BATCHES = (0, 1, 3, 17)
#: strategy boundaries above this many rows are not run (the CPU runs every case)
MAX_STRATEGY_M = 1024
#: awkward output widths: off every 16-, 32- and 64-row tile
AWKWARD_N = (48, 72, 100)
#: the tile-friendly shape, run where a kernel refuses every awkward one (and always in full mode)
ALIGNED = (512, 128)
#: K for schemes without a block along K (channel or tensor scales): off every 16-column tile
UNBLOCKED_K = 200
#: shapes ``supports`` is asked about to tell "this kernel implements the scheme" from a shape refusal
PROBE_SHAPES = ((4096, 4096), ALIGNED)

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


def tolerance(kernel: type[Kernel], act_dtype: torch.dtype, out_dtype: torch.dtype | None = None) -> float:
    """The error a kernel may show against the reference: by activation and output dtype, and by
    whether it declares ``quantizes_activations``."""
    dts = (act_dtype,) if out_dtype is None else (act_dtype, out_dtype)
    base = max(EXACT_ACTIVATIONS.get(d, EXACT_ACTIVATIONS[BF16]) for d in dts)
    return max(base, QUANTIZED_ACTIVATIONS) if kernel.quantizes_activations else base


def block_along_k(scheme: Scheme) -> int | None:
    """The columns one scale (or GGUF block) covers, the step K must be a multiple of; None when
    scales are per channel or per tensor."""
    if scheme.weight == "gguf":
        return GGUF_TYPES[scheme.gguf_type or ""][0]
    if scheme.granularity == "group":
        return scheme.group_size
    if scheme.granularity == "block" and scheme.block is not None:
        return scheme.block[1]
    return None


def awkward_k(scheme: Scheme) -> int:
    """The smallest valid K plus one more block (two blocks), or an odd-sized K without blocks."""
    b = block_along_k(scheme)
    return 2 * b if b else UNBLOCKED_K


# -- cases -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One layer a kernel is checked on: a device, a scheme, an activation dtype and a shape."""

    kernel: type[Kernel]
    device: DeviceCaps
    scheme: Scheme
    dtype: torch.dtype
    K: int
    N: int
    bias: bool
    #: the verdict's reason when the kernel refuses this layer (the case is skipped)
    skip: str = ""
    #: run the torch.compile check on this case (one per kernel and device)
    compile: bool = False

    @property
    def kernel_name(self) -> str:
        return self.kernel.name

    @property
    def backend(self) -> str:
        return self.kernel.backend

    @property
    def device_name(self) -> str:
        """``cpu``, or the device kind's own name and index (``cuda:0``, ``rocm:0``, ``acme:0``)."""
        return device_name(self.device)

    @property
    def id(self) -> str:
        """A stable name for the case (pytest's test id; the per-case seed derives from it)."""
        shape = f"K{self.K}xN{self.N}" if self.K else "any-shape"
        return (
            f"{self.kernel.name}@{self.device_name}-{self.scheme.name}-{DTYPE_NAMES[self.dtype]}-{shape}"
            + ("-bias" if self.bias else "")
        )

    def describe(self) -> str:
        """The case in words, for failure messages."""
        return (
            f"kernel {self.kernel.name} on {self.device_name}, scheme {self.scheme.name}, "
            f"K={self.K} N={self.N}{' with bias' if self.bias else ''}, activations {DTYPE_NAMES[self.dtype]}"
        )

    def spec(self) -> LayerSpec:
        return LayerSpec(self.scheme, self.K, self.N, act_dtype=self.dtype, bias=self.bias)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kernel": self.kernel.name,
            "backend": self.kernel.backend,
            "device": self.device_name,
            "device_kind": self.device.kind,
            "scheme": self.scheme.name,
            "act_dtype": DTYPE_NAMES[self.dtype],
            "K": self.K,
            "N": self.N,
            "bias": self.bias,
        }


def device_name(dev: DeviceCaps) -> str:
    """How cases name a device: ``cpu``, else its kind and index (``cuda:0``, ``rocm:0``, ``acme:0``)."""
    return "cpu" if dev.kind == "cpu" else f"{dev.kind}:{dev.index}"


@dataclass(frozen=True)
class Check:
    """One check of a case: its name, the error found and the error allowed, and what was wrong."""

    name: str
    ok: bool
    error: float | None = None
    allowed: float | None = None
    message: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "check": self.name,
            "ok": self.ok,
            "error": self.error,
            "allowed": self.allowed,
            "message": self.message,
        }


@dataclass
class CaseResult:
    """What one case found: passed, failed (with every failing check) or skipped (with the reason)."""

    case: Case
    status: str
    seed: int
    run_seed: int
    checks: list[Check] = field(default_factory=list)
    reason: str = ""
    seconds: float = 0.0

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def failure_text(self) -> str:
        """Each failing check on one line: the case, the check, the error found vs allowed."""
        head = f"{self.case.describe()} (run seed {self.run_seed}, case seed {self.seed})"
        lines = [head]
        for c in self.failures:
            err = ""
            if c.error is not None and c.allowed is not None:
                err = f": error {_num(c.error)} > allowed {_num(c.allowed)}"
            lines.append(f"  check {c.name} failed{err}" + (f" ({c.message})" if c.message else ""))
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            **self.case.to_json(),
            "status": self.status,
            "reason": self.reason,
            "seed": self.seed,
            "seconds": round(self.seconds, 4),
            "checks": [c.to_json() for c in self.checks],
        }


def _num(v: float) -> str:
    return f"{v:.3g}" if math.isfinite(v) else str(v)


@dataclass
class Report:
    """Every case of one run and the seed that reproduces it."""

    seed: int
    quick: bool
    results: list[CaseResult]
    load_errors: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.load_errors and all(r.status != FAILED for r in self.results)

    def summary(self) -> list[dict[str, Any]]:
        """Per kernel and device: cases passed, failed and skipped."""
        rows: dict[tuple[str, str], dict[str, Any]] = {}
        for r in self.results:
            key = (r.case.kernel.name, r.case.device_name)
            row = rows.setdefault(
                key,
                {
                    "kernel": key[0],
                    "backend": r.case.backend,
                    "device": key[1],
                    PASSED: 0,
                    FAILED: 0,
                    SKIPPED: 0,
                },
            )
            row[r.status] += 1
        return list(rows.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "quick": self.quick,
            "ok": self.ok,
            "load_errors": dict(self.load_errors),
            "summary": self.summary(),
            "cases": [r.to_json() for r in self.results],
        }


# -- planning --------------------------------------------------------------------------------------


def new_seed() -> int:
    """A fresh run seed (printed by every runner, so the run can be replayed)."""
    return random.SystemRandom().randrange(1, 2**31)


@contextlib.contextmanager
def process_registry(reg: Registry | None) -> Iterator[Registry]:
    """Make ``reg`` the process registry while cases build (dispatch forces kernels by name from it)."""
    if reg is None or reg is _kernels._REGISTRY:
        yield _kernels.registry()
        return
    saved = _kernels._REGISTRY
    _kernels._REGISTRY = reg
    try:
        yield reg
    finally:
        _kernels._REGISTRY = saved


def _runnable(caps: Capabilities, kind: str) -> list[DeviceCaps]:
    return [d for d in (caps.cpu, *caps.accelerators) if d.kind == kind and d.runnable]


def kernels_under_test(
    backend: str | None = None,
    kernel: str | None = None,
    registry: Registry | None = None,
    caps: Capabilities | None = None,
) -> list[tuple[type[Kernel], DeviceCaps]]:
    """Every (kernel, device) pair the kit runs: each registered list's kernels on each runnable device
    of the list's kind, in dispatch order, then the reference on every runnable device.

    ``backend`` keeps one backend's kernels (``"reference"``: the fallback), ``kernel`` one kernel.
    """
    reg = registry if registry is not None else _kernels.registry()
    caps = caps or probe()
    known = set(reg.backends) | {lst.backend for lst in reg.lists} | {"reference"}
    if backend is not None and backend in reg.load_errors:
        return []  # the runners report the load error itself
    if backend is not None and backend not in known:
        raise ConfigError(f"no backend {backend!r}; loaded: {', '.join(sorted(known))}")
    if kernel is not None and reg.get(kernel) is None:
        raise ConfigError(f"no kernel {kernel!r}; registered: {', '.join(reg.names())}")
    pairs: list[tuple[type[Kernel], DeviceCaps]] = []
    seen: set[tuple[str, str, int]] = set()
    kinds = list(dict.fromkeys(lst.device_kind for lst in reg.lists))
    for kind in kinds:
        devices = _runnable(caps, kind)
        for lst in reg.order(kind):
            for k in lst.kernels:
                for dev in devices:
                    key = (k.name, dev.kind, dev.index)
                    if key not in seen:
                        seen.add(key)
                        pairs.append((k, dev))
    if reg.fallback is not None:
        for dev in (caps.cpu, *caps.accelerators):
            if dev.runnable:
                pairs.append((reg.fallback, dev))
    return [
        (k, d)
        for k, d in pairs
        if (backend is None or k.backend == backend) and (kernel is None or k.name == kernel)
    ]


def _ask(kernel: type[Kernel], spec: LayerSpec, dev: DeviceCaps) -> Verdict:
    try:
        return kernel.supports(spec, dev)
    except Exception as e:  # a supports() that raises is the kernel's failure, reported as a refusal
        return Verdict.no("supports() raises no error", error=f"{type(e).__name__}: {e}")


def _declared(kernel: type[Kernel]) -> list[torch.dtype]:
    return [d for d in DTYPES if d in kernel.act_dtypes]


def _implements(kernel: type[Kernel], scheme: Scheme, dev: DeviceCaps) -> tuple[list[torch.dtype], str]:
    """The declared dtypes the kernel takes the scheme with at some friendly shape, and the reason
    of the first refusal when it takes none."""
    accepted, reason = [], ""
    for dt in _declared(kernel):
        for K, N in PROBE_SHAPES:
            v = _ask(kernel, LayerSpec(scheme, K, N, act_dtype=dt), dev)
            if v.ok:
                accepted.append(dt)
                break
            reason = reason or v.reason
    return accepted, reason


def _representatives(schemes: Sequence[Scheme]) -> list[Scheme]:
    """Quick mode: per scheme family, the first and the last of the catalog's schemes."""
    by_family: dict[str, list[Scheme]] = {}
    for s in schemes:
        by_family.setdefault(s.family, []).append(s)
    picked: list[Scheme] = []
    for group in by_family.values():
        picked += list(dict.fromkeys((group[0], group[-1])))
    return [s for s in schemes if s in picked]


def _shapes(scheme: Scheme) -> list[tuple[int, int, bool]]:
    K = awkward_k(scheme)
    # bias on the first and last width, none in between: both call paths, one build each
    return [(K, n, i != 1) for i, n in enumerate(AWKWARD_N)]


def plan(
    backend: str | None = None,
    kernel: str | None = None,
    *,
    quick: bool = False,
    schemes: Iterable[Scheme | str] | None = None,
    registry: Registry | None = None,
    caps: Capabilities | None = None,
) -> list[Case]:
    """The cases of a run, skipped ones with their reasons.

    Full: every catalog scheme a kernel implements here x every declared activation dtype x the
    awkward shapes and the aligned one. Quick: per scheme family, the first and last scheme the
    kernel implements, their (scheme, dtype) pairs taking the awkward shapes in turn (every pair and
    every shape run), the aligned shape only where a pair was refused every shape it got.
    """
    caps = caps or probe()
    pool = [parse_scheme(s) if isinstance(s, str) else s for s in schemes] if schemes else list(catalog())
    cases: list[Case] = []
    for k, dev in kernels_under_test(backend, kernel, registry, caps):
        mine: list[tuple[Scheme, list[torch.dtype]]] = []
        reasons: list[str] = []
        for s in pool:
            dts, why = _implements(k, s, dev)
            if dts:
                mine.append((s, dts))
            elif why:
                reasons.append(why)
        own: list[Case] = []
        if quick:
            keep = set(_representatives([s for s, _ in mine]))
            mine = [(s, d) for s, d in mine if s in keep]
            for fam in dict.fromkeys(s.family for s, _ in mine):
                own += _quick_cases(k, dev, [(s, d) for s, d in mine if s.family == fam])
        else:
            for s, dts in mine:
                own += _scheme_cases(k, dev, s, dts)
        first = next((i for i, c in enumerate(own) if not c.skip), None)
        if first is not None:
            own[first] = replace(own[first], compile=True)
        if not mine:
            why = (
                "; ".join(dict.fromkeys(reasons))
                or "it declares none of the activation dtypes fp32, bf16, fp16"
            )
            own.append(
                Case(
                    k,
                    dev,
                    pool[0] if pool else catalog()[0],
                    (_declared(k) or [BF16])[0],
                    0,
                    0,
                    False,
                    skip=f"implements no scheme of the catalog on this device: {_short(why)}",
                )
            )
        cases += own
    return cases


def _refused_dtypes(k: type[Kernel], dev: DeviceCaps, s: Scheme, accepted: list[torch.dtype]) -> list[Case]:
    """A skipped case for each declared dtype the kernel refuses the scheme with, and why."""
    out = []
    for dt in _declared(k):
        if dt not in accepted:
            v = _ask(k, LayerSpec(s, *ALIGNED, act_dtype=dt), dev)
            out.append(Case(k, dev, s, dt, *ALIGNED, False, skip=v.reason))
    return out


def _scheme_cases(k: type[Kernel], dev: DeviceCaps, s: Scheme, accepted: list[torch.dtype]) -> list[Case]:
    """Full mode: every accepted dtype x the awkward shapes and the aligned one."""
    out = _refused_dtypes(k, dev, s, accepted)
    for dt in accepted:
        out += [_case(k, dev, s, dt, K, N, b) for K, N, b in [*_shapes(s), (*ALIGNED, False)]]
    return out


def _quick_cases(
    k: type[Kernel], dev: DeviceCaps, family: list[tuple[Scheme, list[torch.dtype]]]
) -> list[Case]:
    """Quick mode, one scheme family: its (scheme, dtype) pairs take the awkward shapes in turn,
    as many rounds as it takes to run every pair and every shape; the aligned shape where a pair
    is refused every shape it got."""
    out: list[Case] = []
    pairs = [(s, dt) for s, dts in family for dt in dts]
    for s, dts in family:
        out += _refused_dtypes(k, dev, s, dts)
    got: dict[tuple[Scheme, torch.dtype], list[Case]] = {p: [] for p in pairs}
    for i in range(max(len(pairs), len(AWKWARD_N))):
        s, dt = pairs[i % len(pairs)]
        K, N, b = _shapes(s)[i % len(AWKWARD_N)]
        got[(s, dt)].append(_case(k, dev, s, dt, K, N, b))
    for (s, dt), cases in got.items():
        if all(c.skip for c in cases):
            cases.append(_case(k, dev, s, dt, *ALIGNED, False))
        out += cases
    return out


def _case(k: type[Kernel], dev: DeviceCaps, s: Scheme, dt: torch.dtype, K: int, N: int, bias: bool) -> Case:
    v = _ask(k, LayerSpec(s, K, N, act_dtype=dt, bias=bias), dev)
    return Case(k, dev, s, dt, K, N, bias, skip="" if v.ok else v.reason)


# -- running ---------------------------------------------------------------------------------------


def case_seed(run_seed: int, case: Case) -> int:
    """The case's own seed: the run seed and the case id, hashed (stable across processes)."""
    return zlib.crc32(f"{run_seed}/{case.id}".encode())


def _layer_device(dev: DeviceCaps) -> str:
    """What a layer is built on: the torch device when it names this device, else the kind's own
    name (``acme:0``: a kind whose tensors live in host memory is not the CPU)."""
    try:
        if probe().device(dev.torch_device) == dev:
            return dev.torch_device
    except Exception:
        pass
    return f"{dev.kind}:{dev.index}"


def rel_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    """DESIGN.md's metric: ``||y - ref||_F / ||ref||_F`` in float64 (0 when both are 0)."""
    y64, r64 = y.detach().double().cpu(), ref.detach().double().cpu()
    den = float(r64.norm())
    num = float((y64 - r64).norm())
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den


class _Ctx:
    """Everything a case's checks share: the layer, the canonical weight, the generator."""

    def __init__(self, case: Case, seed: int) -> None:
        from .. import reference

        self.case = case
        self.gen = torch.Generator().manual_seed(seed)
        self.device = torch.device(case.device.torch_device)
        K, N = case.K, case.N
        w = torch.randn(N, K, generator=self.gen) * 0.05
        calib = torch.randn(16, K, generator=self.gen)
        self.weight = reference.quantize(w, case.scheme, calib=calib)
        self.bias = (torch.randn(N, generator=self.gen) * 0.1).to(case.dtype) if case.bias else None
        self.tol = tolerance(case.kernel, case.dtype)
        self.layer: Any = None
        self.weight_only = False

    def x(self, m: int, k: int | None = None) -> torch.Tensor:
        return torch.randn(m, k or self.case.K, generator=self.gen).to(self.case.dtype)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        from .. import reference

        return reference.linear(
            x.cpu(), self.weight, self.bias, out_dtype=torch.float32, weight_only=self.weight_only
        )


def _build(ctx: _Ctx) -> Check:
    from ..env import Overrides
    from ..layers import QuantLinear

    case = ctx.case
    layer = QuantLinear.from_canonical(
        ctx.weight,
        bias=ctx.bias,
        device=_layer_device(case.device),
        act_dtype=case.dtype,
        overrides=Overrides(kernel=case.kernel.name),
    )
    if layer.kernel_name != case.kernel.name:
        return Check("build", False, message=f"the layer runs {layer.kernel_name}, not the forced kernel")
    ctx.layer = layer
    ctx.weight_only = bool(case.kernel.is_substitute(layer.layer_spec()))
    return Check("build", True)


def _expect(ctx: _Ctx, name: str, y: Any, m: int, dtype: torch.dtype | None = None) -> Check | None:
    """A check failure when ``y`` is not an [m, N] tensor of the declared dtype on the device."""
    want = dtype or ctx.case.dtype
    if not isinstance(y, torch.Tensor):
        return Check(name, False, message=f"returned {type(y).__name__}, not a tensor")
    if tuple(y.shape) != (m, ctx.case.N) or y.dtype != want or y.device.type != ctx.device.type:
        found = f"{str(y.dtype).replace('torch.', '')} {list(y.shape)} on {y.device}"
        need = f"{DTYPE_NAMES.get(want, want)} [{m}, {ctx.case.N}] on {ctx.device}"
        return Check(name, False, message=f"returned {found}, expected {need}")
    return None


def _compare(ctx: _Ctx, name: str, y: torch.Tensor, ref: torch.Tensor, tol: float) -> Check:
    if not bool(torch.isfinite(y).all()):
        bad = int((~torch.isfinite(y)).sum())
        return Check(name, False, math.inf, tol, f"{bad} non-finite outputs for finite inputs")
    err = rel_error(y, ref)
    return Check(name, err <= tol, err, tol)


def _other_dtype(dt: torch.dtype) -> torch.dtype:
    return FP32 if dt != FP32 else BF16


def _accuracy(ctx: _Ctx) -> list[Check]:
    case, layer, dev = ctx.case, ctx.layer, ctx.device
    N, K = case.N, case.K
    checks: list[Check] = []

    def run(name: str, m: int, x: torch.Tensor, out: torch.Tensor | None = None) -> None:
        try:
            y = layer(x) if out is None else layer(x, out=out)
        except Exception as e:
            checks.append(Check(name, False, message=f"raised {type(e).__name__}: {_short(e)}"))
            return
        odt = out.dtype if out is not None else None
        bad = _expect(ctx, name, y, m, odt)
        if bad is not None:
            checks.append(bad)
            return
        if out is not None and m and y.data_ptr() != out.data_ptr():
            checks.append(Check(name, False, message="out= was given but the result is another tensor"))
            return
        if m == 0:
            checks.append(Check(name, True))
            return
        checks.append(_compare(ctx, name, y, ctx.reference(x), tolerance(case.kernel, case.dtype, odt)))

    run("M=0", 0, ctx.x(0).to(dev))
    run("M=0 out=", 0, ctx.x(0).to(dev), torch.empty(0, N, dtype=case.dtype, device=dev))
    run("M=1", 1, ctx.x(1).to(dev))
    run("M=3 strided x", 3, ctx.x(3, 2 * K).to(dev)[:, ::2])
    run(
        "M=17 row-padded x, out=",
        17,
        ctx.x(17, K + 8).to(dev)[:, :K],
        torch.empty(17, N, dtype=case.dtype, device=dev),
    )
    run(
        f"M=3 out= {DTYPE_NAMES[_other_dtype(case.dtype)]}",
        3,
        ctx.x(3).to(dev),
        torch.empty(3, N, dtype=_other_dtype(case.dtype), device=dev),
    )
    checks.append(_out_window(ctx))
    for m in _strategy_batches(layer):
        run(f"M={m} strategy {layer._state.strategy(m).name!r}", m, ctx.x(m).to(dev))
    return checks


def _out_window(ctx: _Ctx) -> Check:
    """``out=`` a column window of a wider buffer: the window filled, the columns around it untouched."""
    case, dev, name = ctx.case, ctx.device, "M=5 out= column window"
    N = case.N
    x = ctx.x(5).to(dev)
    wide = torch.full((5, N + 5), float("nan"), dtype=case.dtype, device=dev)
    out = wide[:, 2 : 2 + N]
    try:
        y = ctx.layer(x, out=out)
    except Exception as e:
        return Check(name, False, message=f"raised {type(e).__name__}: {_short(e)}")
    bad = _expect(ctx, name, y, 5)
    if bad is not None:
        return bad
    if not (bool(wide[:, :2].isnan().all()) and bool(wide[:, 2 + N :].isnan().all())):
        return Check(name, False, message="wrote outside the out= window")
    return _compare(ctx, name, out, ctx.reference(x), ctx.tol)


def _strategy_batches(layer: Any) -> list[int]:
    """The first and last batch of every strategy boundary (up to MAX_STRATEGY_M) not run already."""
    ms: list[int] = []
    for s in layer._state.strategies[:-1]:
        for m in (s.max_m, s.max_m + 1):
            if 0 < m <= MAX_STRATEGY_M and m not in BATCHES and m not in ms:
                ms.append(m)
    return ms


def _nonfinite(ctx: _Ctx) -> Check:
    """Rows 0-2 spoiled (a NaN; a +Inf; a -Inf), row 3 clean: the non-finite outputs where the
    reference has them, the finite ones close."""
    name, case = "nonfinite", ctx.case
    x = ctx.x(4)
    cols = torch.randint(0, case.K, (3,), generator=ctx.gen).tolist()
    x[0, cols[0]], x[1, cols[1]], x[2, cols[2]] = float("nan"), float("inf"), float("-inf")
    try:
        y = ctx.layer(x.to(ctx.device))
    except Exception as e:
        return Check(name, False, message=f"raised {type(e).__name__}: {_short(e)}")
    bad = _expect(ctx, name, y, 4)
    if bad is not None:
        return bad
    ref = ctx.reference(x)
    got, want = torch.isfinite(y.float().cpu()), torch.isfinite(ref)
    if not torch.equal(got, want):
        lines = []
        for r, what in enumerate(("a NaN", "a +Inf", "a -Inf", "no non-finite value")):
            g, w = int((~got[r]).sum()), int((~want[r]).sum())
            if g != w or not torch.equal(got[r], want[r]):
                lines.append(f"row {r} ({what}): {g} non-finite outputs, the reference {w}")
        return Check(name, False, message="; ".join(lines) + f" (of {case.N})")
    if bool(want.any()):
        err = rel_error(y.float().cpu()[want], ref[want])
        return Check(name, err <= ctx.tol, err, ctx.tol, "" if err <= ctx.tol else "finite outputs")
    return Check(name, True)


def _determinism(ctx: _Ctx) -> Check:
    x = ctx.x(17).to(ctx.device)
    try:
        a, b = ctx.layer(x), ctx.layer(x)
    except Exception as e:
        return Check("determinism", False, message=f"raised {type(e).__name__}: {_short(e)}")
    if torch.equal(a, b):
        return Check("determinism", True)
    diff = int((a != b).sum())
    return Check(
        "determinism", False, rel_error(b, a), 0.0, f"two calls on one input differ at {diff} outputs"
    )


def _same(name: str, y: torch.Tensor, eager: torch.Tensor, tol: float, bitwise: bool) -> Check:
    """Equal to eager: bitwise where the kernel is deterministic, else within the tolerance."""
    if y.shape != eager.shape or y.dtype != eager.dtype:
        return Check(
            name, False, message=f"{y.dtype} {list(y.shape)}, eager {eager.dtype} {list(eager.shape)}"
        )
    if bitwise:
        if torch.equal(y, eager):
            return Check(name, True)
        return Check(
            name, False, rel_error(y, eager), 0.0, f"differs from eager at {int((y != eager).sum())} outputs"
        )
    err = rel_error(y, eager)
    return Check(name, err <= tol, err, tol, "kernel not deterministic: compared within the tolerance")


def _compile(ctx: _Ctx, deterministic: bool) -> Check:
    layer = ctx.layer
    x = ctx.x(3).to(ctx.device)
    try:
        torch._dynamo.reset()  # one fresh compile per kernel: no cache limit, no guard reuse across layers
        compiled = torch.compile(lambda t: layer(t), fullgraph=True)
        y = compiled(x)
        eager = layer(x)
    except Exception as e:
        return Check("compile", False, message=f"raised {type(e).__name__}: {_short(e)}")
    finally:
        torch._dynamo.reset()
    return _same("compile", y, eager, ctx.tol, deterministic)


def _cuda_graph(ctx: _Ctx, deterministic: bool) -> Check:
    name, layer, dev = "cuda-graph", ctx.layer, ctx.device
    static_x = ctx.x(3).to(dev)
    try:
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            for _ in range(2):
                layer(static_x)
        torch.cuda.current_stream(dev).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_y = layer(static_x)
        fresh = ctx.x(3).to(dev)
        static_x.copy_(fresh)
        graph.replay()
        torch.cuda.synchronize(dev)
        eager = layer(fresh)
    except Exception as e:
        with contextlib.suppress(Exception):
            torch.cuda.synchronize(dev)
        return Check(name, False, message=f"raised {type(e).__name__}: {_short(e)}")
    return _same(name, static_y, eager, ctx.tol, deterministic)


def _short(e: BaseException, limit: int = 300) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def run_case(case: Case, run_seed: int) -> CaseResult:
    """Build the case's layer and run every check on it (a build failure stops the rest)."""
    seed = case_seed(run_seed, case)
    t0 = time.perf_counter()
    if case.skip:
        return CaseResult(case, SKIPPED, seed, run_seed, reason=case.skip)
    checks: list[Check] = []
    try:
        ctx = _Ctx(case, seed)
        checks.append(_build(ctx))
    except Exception as e:
        checks.append(Check("build", False, message=f"raised {type(e).__name__}: {_short(e)}"))
    if all(c.ok for c in checks):
        checks += _accuracy(ctx)
        checks.append(_nonfinite(ctx))
        det = _determinism(ctx)
        checks.append(det)
        if case.compile:
            checks.append(_compile(ctx, det.ok))
        if ctx.device.type == "cuda":
            checks.append(_cuda_graph(ctx, det.ok))
    status = PASSED if all(c.ok for c in checks) else FAILED
    return CaseResult(case, status, seed, run_seed, checks, seconds=time.perf_counter() - t0)


def run(
    cases: Sequence[Case],
    seed: int | None = None,
    *,
    quick: bool = False,
    registry: Registry | None = None,
    progress: Callable[[CaseResult], None] | None = None,
) -> Report:
    """Run ``cases`` (from :func:`plan`) with one run seed (a fresh one when None)."""
    seed = new_seed() if seed is None else int(seed)
    results: list[CaseResult] = []
    with process_registry(registry):
        for case in cases:
            r = run_case(case, seed)
            results.append(r)
            if progress is not None:
                progress(r)
    return Report(seed, quick, results)


def load_errors(reg: Registry, backend: str | None = None, kernel: str | None = None) -> dict[str, str]:
    """The backends that failed to load and are under test (all of them unless one is named)."""
    if kernel is not None and backend is None:
        return {}
    return {b: e for b, e in reg.load_errors.items() if backend in (None, b)}


def verify(
    backend: str | None = None,
    kernel: str | None = None,
    *,
    quick: bool = False,
    seed: int | None = None,
    schemes: Iterable[Scheme | str] | None = None,
    registry: Registry | None = None,
    progress: Callable[[CaseResult], None] | None = None,
) -> Report:
    """Plan and run in one call (what ``quantrt verify`` does); a backend under test that failed to
    load makes the report fail."""
    with process_registry(registry) as reg:
        cases = plan(backend, kernel, quick=quick, schemes=schemes, registry=reg)
        report = run(cases, seed, quick=quick, registry=reg, progress=progress)
        report.load_errors = load_errors(reg, backend, kernel)
    return report
