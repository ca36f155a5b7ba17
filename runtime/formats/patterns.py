r"""Name patterns taken from checkpoint configs, matched in bounded time.

Configs match layer names by pattern: GPTQModel's ``dynamic`` keys (``+:regex`` / ``-:regex``),
compressed-tensors' ``re:`` entries of ``ignore`` and ``targets``, auto-round's ``extra_config``
keys, ModelOpt's and Quark's fnmatch wildcards. A config is untrusted input, and Python's
backtracking ``re`` can spend minutes on one crafted pattern per layer name, so every pattern
is compiled once with the ``regex`` package (mrab-regex) and each match runs under a timeout.
Before compiling, a pattern's length, group nesting and counted repeats (``(?:a{1000}){1000}``
makes the compiler itself expand a billion nodes) are bounded; each failure is one
CheckpointError naming the config key, the pattern and why.

The tools wrote their patterns for Python's ``re``, so a pattern must compile there too (``regex``
extensions such as ``(?R)`` or ``\p{L}`` are refused), and a brace that ``re`` reads as a literal
is escaped before ``regex`` could read it as a fuzzy-match constraint (``a{e<=1}``).
"""

from __future__ import annotations

import fnmatch
import re
import time
from collections.abc import Callable, Iterable
from typing import Any

import regex

from ..errors import CheckpointError

#: longest pattern accepted (real ones are a few dozen characters)
MAX_CHARS = 1000
#: most patterns one config key may hold
MAX_PATTERNS = 10_000
#: deepest group nesting accepted (the compiler recurses per level)
MAX_DEPTH = 50
#: most pattern nodes that counted repeats may expand to
MAX_EXPANSION = 10_000
#: seconds one match may take before the pattern is refused
MATCH_TIMEOUT_S = 0.5
#: seconds all matches of one config key's patterns may take together, so patterns each just
#: under the timeout on every one of many layer names still end (a legitimate key over 50k
#: layer names of a large MoE takes a few seconds)
TOTAL_BUDGET_S = 60.0

_COUNTED = re.compile(r"\{(\d*)(?:,(\d*))?\}")


def _counted(p: str, i: int) -> re.Match[str] | None:
    """The counted repeat (``{m}``, ``{m,}``, ``{,n}``, ``{m,n}``, ``{,}``) at ``p[i]``, as
    Python's ``re`` reads one; any other brace is a literal there."""
    m = _COUNTED.match(p, i)
    return m if m and (m.group(1) or m.group(2) is not None) else None


def _class_end(p: str, i: int) -> int:
    """The index after the character class that opens at ``p[i] == "["``."""
    n = len(p)
    j = i + 1
    j += j < n and p[j] == "^"
    j += j < n and p[j] == "]"
    while j < n and p[j] != "]":
        j += 2 if p[j] == "\\" else 1
    return j + 1


def _literal_braces(p: str) -> str:
    """``p`` with every brace ``re`` reads as a literal escaped, so ``regex`` reads it so too."""
    out, i, n = [], 0, len(p)
    while i < n:
        c = p[i]
        if c == "\\":
            out.append(p[i : i + 2])
            i += 2
        elif c == "[":
            j = _class_end(p, i)
            out.append(p[i:j])
            i = j
        elif c == "{" and not _counted(p, i):
            out.append("\\{")
            i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _short(text: str, n: int = 80) -> str:
    return text if len(text) <= n else f"{text[:n]}... ({len(text)} characters)"


def _too_complex(p: str) -> str | None:
    """Why compiling ``p`` could blow up (deep nesting, huge counted repeats), or None.

    Walks the pattern once keeping, per open group, the nodes it expands to and the size of its
    last atom, so ``x{n}`` multiplies ``x`` by ``n`` and nested repeats multiply together.
    """
    stack: list[list[int]] = [[0, 0]]  # per open group: [expanded size, size of the last atom]
    i, n = 0, len(p)
    while i < n:
        c = p[i]
        if c == "\\":
            atom, i = 1, i + 2
        elif c == "[":
            atom, i = 1, _class_end(p, i)
        elif c == "(":
            stack.append([0, 0])
            if len(stack) > MAX_DEPTH:
                return f"its groups nest deeper than {MAX_DEPTH}"
            i += 1
            continue
        elif c == ")":
            atom = max(stack.pop()[0], 1) if len(stack) > 1 else 1
            i += 1
        elif c == "{" and (m := _counted(p, i)):
            count = max(int(m.group(1) or 0), int(m.group(2) or 0))
            top = stack[-1]
            top[0] = max(0, top[0] + top[1] * (count - 1))
            top[1] *= count
            i = m.end()
            if top[0] > MAX_EXPANSION:
                return f"its counted repeats expand to more than {MAX_EXPANSION} nodes"
            continue
        elif c in "*+?|":
            i += 1
            continue
        else:
            atom, i = 1, i + 1
        top = stack[-1]
        top[0] += atom
        top[1] = atom
        if top[0] > MAX_EXPANSION:
            return f"its counted repeats expand to more than {MAX_EXPANSION} nodes"
    return None


class Budget:
    """Seconds of matching left to the patterns of one config key."""

    __slots__ = ("left",)

    def __init__(self, seconds: float = TOTAL_BUDGET_S) -> None:
        self.left = seconds


class Pattern:
    """One pattern of a config, compiled once; each match is bounded in time.

    ``where`` names the config key (``<file>: quantization_config.ignore``); ``glob`` reads the
    text as an fnmatch wildcard (translated to a regex, as fnmatch itself does); ``budget`` is
    shared by the patterns of one key.
    """

    __slots__ = ("_budget", "_compiled", "text", "where")

    def __init__(self, text: Any, where: str, *, glob: bool = False, budget: Budget | None = None) -> None:
        if not isinstance(text, str):
            raise CheckpointError(f"{where}: expected a pattern string, found {text!r}")
        self.text, self.where, self._budget = text, where, budget or Budget()
        if len(text) > MAX_CHARS:
            raise CheckpointError(
                f"{where}: pattern {_short(text)!r} is longer than the {MAX_CHARS} characters accepted"
            )
        source = fnmatch.translate(text) if glob else text
        why = _too_complex(source)
        if why is not None:
            raise CheckpointError(f"{where}: pattern {_short(text)!r} is refused: {why}")
        try:
            re.compile(source)  # the syntax the tools wrote for; compiling expands nothing
            self._compiled = regex.compile(_literal_braces(source))
        except (re.error, regex.error, RecursionError, OverflowError, ValueError, MemoryError) as e:
            raise CheckpointError(
                f"{where}: pattern {_short(text)!r} is not a valid regular expression: {e}"
            ) from None

    def match(self, name: str) -> bool:
        """Whether the pattern matches at the start of ``name`` (``re.match``)."""
        return self._run(self._compiled.match, name)

    def fullmatch(self, name: str) -> bool:
        """Whether the pattern matches all of ``name`` (``re.fullmatch``; globs always do)."""
        return self._run(self._compiled.fullmatch, name)

    def _run(self, fn: Callable[..., Any], name: str) -> bool:
        limit = min(MATCH_TIMEOUT_S, self._budget.left)
        start = time.perf_counter()
        try:
            if limit <= 0:
                raise TimeoutError
            found = fn(name, timeout=limit) is not None
        except TimeoutError:
            why = (
                f"took over {MATCH_TIMEOUT_S} s to match {name!r}"
                if limit == MATCH_TIMEOUT_S
                else f"used up the {TOTAL_BUDGET_S} s its key's patterns may spend on layer names"
            )
            raise CheckpointError(
                f"{self.where}: pattern {_short(self.text)!r} {why} (catastrophic backtracking); "
                "quantrt refuses patterns it cannot match in bounded time"
            ) from None
        self._budget.left -= time.perf_counter() - start
        return found


def compile_patterns(texts: Iterable[Any], where: str, *, glob: bool = False) -> list[Pattern]:
    """Every pattern of one config key, compiled once, with their count bounded."""
    texts = list(texts)
    if len(texts) > MAX_PATTERNS:
        raise CheckpointError(f"{where}: {len(texts)} patterns; at most {MAX_PATTERNS} are accepted")
    budget = Budget()
    return [Pattern(t, where, glob=glob, budget=budget) for t in texts]


class NameRules:
    """Exact layer names and ``re:<regex>`` rules (compressed-tensors' ``ignore`` and ``targets``,
    and the lists that borrow its syntax); regexes match from the start of the name."""

    def __init__(self, rules: Iterable[str], where: str) -> None:
        rules = list(rules)
        self.names = {r for r in rules if not r.startswith("re:")}
        self.regexes = compile_patterns([r[3:] for r in rules if r.startswith("re:")], where)

    def first(self, name: str) -> str | None:
        """The rule that matches ``name``: the name itself, or the first matching ``re:`` rule."""
        if name in self.names:
            return name
        for p in self.regexes:
            if p.match(name):
                return "re:" + p.text
        return None

    def __bool__(self) -> bool:
        return bool(self.names or self.regexes)
