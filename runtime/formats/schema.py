"""Typed quantization configs: every format declares the keys it reads as a pydantic model.

A config is untrusted input: a string, list or null where an int is due, ``bits: 4.7``
(``int()`` would truncate it), ``"sym": "false"`` (``bool()`` would make it true) or ``ignore``
given as one string (iterated by character) must each be one clear CheckpointError, never a
TypeError deep in a reader. The leaf types below are strict (an int field refuses ``4.7``,
``"4"`` and ``true``) and carry their bounds; unknown keys are kept unvalidated, since real
configs carry many a reader never looks at. :func:`validate` turns the first problem into
``"<file>: quantization_config.<path>: expected <X>, found <value>"``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, PlainValidator, ValidationError, WrapValidator
from pydantic_core import PydanticCustomError

from ..errors import CheckpointError

T = TypeVar("T", bound=BaseModel)


class Config(BaseModel):
    """A config section: the keys quantrt reads are typed, every other key is kept as it is."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)


def leaf(expected: str, ok: Callable[[Any], bool]) -> PlainValidator:
    """A validator that passes the value through unchanged when ``ok``, else names what was due."""

    def check(v: Any) -> Any:
        if ok(v):
            return v
        raise PydanticCustomError("quantrt", "{expected}", {"expected": expected})

    return PlainValidator(check)


def _is_int(v: Any) -> bool:
    return type(v) is int  # bool is an int subclass; JSON true is not a bit width


def int_in(lo: int, hi: int) -> Any:
    """An integer in [lo, hi]."""
    return Annotated[int, leaf(f"an integer from {lo} to {hi}", lambda v: _is_int(v) and lo <= v <= hi)]


Int = Annotated[int, leaf("an integer", _is_int)]
Positive = Annotated[int, leaf("a positive integer", lambda v: _is_int(v) and v > 0)]
#: GPTQ/AWQ/compressed-tensors group sizes: -1 (or 0) is one group per row
GroupSize = Annotated[int, leaf("-1, 0 or a positive integer", lambda v: _is_int(v) and v >= -1)]
Bool = Annotated[bool, leaf("true or false", lambda v: type(v) is bool)]
Str = Annotated[str, leaf("a string", lambda v: type(v) is str)]
Number = Annotated[float, leaf("a finite number", lambda v: type(v) in (int, float) and math.isfinite(v))]
StrList = Annotated[
    list[str], leaf("a list of strings", lambda v: type(v) is list and all(type(s) is str for s in v))
]
#: two positive integers: a [rows, cols] block or a [out_features, in_features] shape
PositivePair = Annotated[
    list[int],
    leaf(
        "a list of two positive integers",
        lambda v: type(v) is list and len(v) == 2 and all(_is_int(x) and x > 0 for x in v),
    ),
]


#: validate as the annotated model unless the value is a list (a shape a reader refuses by name)
LIST_PASSES = WrapValidator(lambda v, handler: v if isinstance(v, list) else handler(v))


def split_source(source: str) -> tuple[str, str]:
    """``"<dir>/config.json (quantization_config)"`` -> (the file, the key the config sits under);
    a side file (``quantize_config.json``) is the config itself."""
    if source.endswith(")") and " (" in source:
        file, key = source[:-1].rsplit(" (", 1)
        return file, key
    return source, "quantization_config"


def config_path(source: str, *path: str | int, root: str | None = None) -> str:
    """``<file>: quantization_config.<path>``: how every config error names the key at fault."""
    file, text = split_source(source) if root is None else (source, root)
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        elif part.isidentifier():
            text += f".{part}" if text else part
        else:
            text += f"[{part!r}]"
    return f"{file}: {text}" if text else file


def _found(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 120 else text[:117] + "..."


_EXPECTED = {
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
    "list_type": "a list",
    "string_type": "a string",
}


def describe(error: Mapping[str, Any], source: str, root: str | None = None) -> str:
    """One pydantic error as quantrt's message: the file, the key path, expected vs found."""
    loc = tuple(error.get("loc", ()))
    kind = error.get("type")
    if kind == "missing":
        return f"{config_path(source, *loc[:-1], root=root)}: has no {loc[-1]!r}"
    if kind == "quantrt":
        expected = error["ctx"]["expected"]
    else:
        expected = _EXPECTED.get(str(kind), str(error.get("msg", "a valid value")).lower())
    return f"{config_path(source, *loc, root=root)}: expected {expected}, found {_found(error.get('input'))}"


def validate(schema: type[T], data: Any, source: str, root: str | None = None) -> T:
    """``data`` checked against ``schema``; the first problem is one CheckpointError.

    ``source`` names where the config came from (``<file> (<key>)``, as find_quant_config
    reports it); ``root`` replaces the key path's start for documents that are not the
    quantization config (a bitsandbytes quant state, torchao tensor metadata).
    """
    try:
        return schema.model_validate(data)
    except ValidationError as e:
        errors = e.errors()
        raise CheckpointError(describe(errors[0], source, root)) from None


__all__ = [
    "LIST_PASSES",
    "Bool",
    "Config",
    "GroupSize",
    "Int",
    "Number",
    "Positive",
    "PositivePair",
    "Str",
    "StrList",
    "config_path",
    "describe",
    "int_in",
    "leaf",
    "split_source",
    "validate",
]
