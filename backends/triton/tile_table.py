"""Committed launch tables (a vendor folder's ``tunings/<name>_<arch>.json``, else
``<name>_default.json``) and, for the Triton kernels, their tile configurations per M bucket,
resolved for one layer at load: nothing tunes while a user waits, and a call only compares M.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

#: M buckets: a batch of m rows uses the first bucket whose bound is >= m
BUCKETS = (1, 16, 64, 256, 1 << 62)
KEYS = ("1", "16", "64", "256", "large")  # their names in the tables


def load(package: str, name: str, arch: str) -> dict[str, Any]:
    """The table of ``package`` (a vendor folder) for this architecture, or the hand-set default
    every install carries."""
    base = resources.files(package) / "tunings"
    for file in (f"{name}_{arch}.json", f"{name}_default.json"):
        path = base / file
        if path.is_file():
            return json.loads(path.read_text())
    raise FileNotFoundError(f"{package}.tunings/{name}_default.json is missing from the install")


def fit(tile: int, block: int | None) -> int:
    """The largest power of two up to ``tile`` that divides ``block`` (a group or a scale block),
    so a tile never straddles two scales."""
    if block is None:
        return tile
    while tile > 1 and block % tile:
        tile //= 2
    return tile


def tile_configs(
    section: dict[str, Any], N: int, K: int, make: Any, block: tuple[int | None, int | None] = (None, None)
) -> tuple:
    """One configuration per bucket (``make``: the kernel module's TileConfig). ``block`` (rows,
    inputs) of one scale: tiles are fitted inside it. ``split_k_target``: programs to aim for at
    small M; K is split until N/BN * split reaches it."""
    configs = []
    for key in KEYS:
        c = dict(section[key])
        c["block_n"] = fit(c["block_n"], block[0])
        c["block_k"] = fit(c["block_k"], block[1])
        target = c.pop("split_k_target", None)
        if target is not None:
            n_tiles = -(-N // c["block_n"])
            k_tiles = max(1, -(-K // c["block_k"]))
            c["split_k"] = max(1, min(k_tiles, -(-int(target) // n_tiles)))
        configs.append(make(**c))
    return tuple(configs)


def pick(configs: tuple, m: int) -> Any:
    """The configuration of the first bucket that holds ``m`` rows."""
    for bound, c in zip(BUCKETS, configs):
        if m <= bound:
            return c
    return configs[-1]


def describe(c: Any) -> str:
    """A configuration as plans and benchmarks print it."""
    return f"{'splitk' if c.split_k > 1 else 'tile'} BM{c.block_m} BN{c.block_n} BK{c.block_k} S{c.split_k}"
