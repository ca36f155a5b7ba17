"""Bounded fuzzing of the readers: GGUF bytes, safetensors headers and quantization configs.

Each case writes a mutated checkpoint, opens it, lists its layers, and reads and dequantizes
every quantized layer, the work ``inspect`` and loading do. The only exception allowed out is a
``QuantrtError`` (one clear refusal); anything else fails the case, and so does a case that runs
past its time limit (an alarm) or grows the process's peak memory past a bound. The seeds start
from valid files written by the real tools (gguf-py's writer; the tools behind the interop
fixtures), so most mutations reach deep into the readers rather than failing at the magic bytes.
Sized to run for about a minute in CI.
"""

from __future__ import annotations

import contextlib
import json
import resource
import shutil
import signal
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import quantrt
from quantrt.errors import QuantrtError

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

INTEROP = Path(__file__).resolve().parents[1] / "fixtures" / "interop"
#: seconds one case may take: a valid fixture takes a few hundredths
CASE_SECONDS = 5
#: growth of the process's peak resident memory over the whole run: the fixtures are < 1 MB
PEAK_GROWTH_BYTES = 1 << 30
SETTINGS = settings(
    max_examples=1500,
    deadline=None,  # the alarm below bounds each case; hypothesis' deadline would only measure
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,  # nothing written into the checkout; failures print their case
)


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@contextlib.contextmanager
def time_limit(seconds: int) -> Iterator[None]:
    def fire(signum: int, frame: object) -> None:
        raise TimeoutError(f"a case ran past {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def exercise(path: Path) -> None:
    """What inspect and loading do with a checkpoint; only a QuantrtError may come out."""
    with time_limit(CASE_SECONDS):
        try:
            ckpt = quantrt.open_checkpoint(path)
            ckpt.summary()
            for _, weight in ckpt.weights():
                weight.dequantize()
        except QuantrtError:
            pass


@pytest.fixture(scope="module")
def baseline() -> int:
    return peak_rss()


def check_memory(baseline: int) -> None:
    grown = peak_rss() - baseline
    assert grown <= PEAK_GROWTH_BYTES, f"peak memory grew by {grown} bytes"


# -- GGUF ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gguf_seed(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A small valid llama GGUF from gguf-py's writer: Q8_0 and Q4_0 linears, an F32 norm, a
    3-D stacked expert tensor and string-array metadata."""
    import gguf
    from gguf.quants import quantize

    path = tmp_path_factory.mktemp("gguf") / "seed.gguf"
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(64)
    w.add_head_count(2)
    w.add_token_list(["<s>", "</s>", "a", "b"])
    for name, qtype, shape in [
        ("blk.0.attn_q.weight", gguf.GGMLQuantizationType.Q8_0, (64, 64)),
        ("blk.0.ffn_down.weight", gguf.GGMLQuantizationType.Q4_0, (32, 64)),
        ("blk.0.ffn_up_exps.weight", gguf.GGMLQuantizationType.Q8_0, (2, 32, 64)),
    ]:
        data = rng.standard_normal(shape).astype(np.float32)
        w.add_tensor(name, quantize(data, qtype), raw_dtype=qtype)
    w.add_tensor("blk.0.attn_norm.weight", rng.standard_normal(64).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    raw = path.read_bytes()
    assert quantrt.open_checkpoint(path).layers  # the seed itself is valid
    return raw


EXTREMES = [0, 1, 2**31 - 1, 2**32 - 1, 2**32, 2**40, 2**63 - 1, 2**64 - 1]


@st.composite
def gguf_mutation(draw: st.DrawFn, size: int) -> list[tuple[str, int, int]]:
    """Edits: overwrite a byte, overwrite 8 bytes with an extreme u64, or truncate."""
    edits = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["byte", "u64", "u32", "truncate"]))
        head = min(size, 4096)  # the header, where the counts and lengths live
        pos = draw(st.one_of(st.integers(0, head - 1), st.integers(0, size - 1)))
        value = draw(st.one_of(st.integers(0, 255), st.sampled_from(EXTREMES)))
        edits.append((kind, pos, value))
    return edits


def apply_edits(raw: bytes, edits: list[tuple[str, int, int]]) -> bytes:
    data = bytearray(raw)
    for kind, pos, value in edits:
        if kind == "truncate":
            del data[pos:]
        elif kind == "byte" and pos < len(data):
            data[pos] = value & 0xFF
        elif kind == "u64" and pos + 8 <= len(data):
            data[pos : pos + 8] = struct.pack("<Q", value % 2**64)
        elif kind == "u32" and pos + 4 <= len(data):
            data[pos : pos + 4] = struct.pack("<I", value % 2**32)
    return bytes(data)


def test_fuzz_gguf(gguf_seed: bytes, tmp_path: Path, baseline: int) -> None:
    path = tmp_path / "case.gguf"

    @SETTINGS
    @given(edits=gguf_mutation(len(gguf_seed)))
    def case(edits: list[tuple[str, int, int]]) -> None:
        path.write_bytes(apply_edits(gguf_seed, edits))
        exercise(path)

    case()
    check_memory(baseline)


# -- safetensors headers ------------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**64), 2**64) | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
SEED_DIR = INTEROP / "gptqmodel-gptq-w4g128-asym-v2"


def read_safetensors(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


@st.composite
def header_mutation(draw: st.DrawFn, names: list[str]) -> list[tuple[str, str, object]]:
    """Edits of tensor entries: a field replaced by any JSON value, a field or entry deleted, an
    offset or dim moved by a little or set to an extreme."""
    edits = []
    for _ in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from(names))
        field = draw(st.sampled_from(["dtype", "shape", "data_offsets", "__entry__"]))
        how = draw(st.sampled_from(["json", "delete", "nudge", "extreme"]))
        value = draw(
            JSON_VALUES
            if how == "json"
            else st.integers(-3, 3)
            if how == "nudge"
            else st.sampled_from(EXTREMES)
            if how == "extreme"
            else st.none()
        )
        edits.append((name, f"{field}:{how}", value))
    return edits


def mutate_header(header: dict, edits: list[tuple[str, str, object]]) -> dict:
    h = json.loads(json.dumps(header))
    for name, what, value in edits:
        field, how = what.split(":")
        if name not in h:
            continue
        if field == "__entry__":
            if how == "delete":
                del h[name]
            else:
                h[name] = value
            continue
        entry = h[name]
        if not isinstance(entry, dict):
            continue
        if how == "delete":
            entry.pop(field, None)
        elif how == "json":
            entry[field] = value
        elif isinstance(entry.get(field), list) and entry[field] and isinstance(value, int):
            i = abs(value) % len(entry[field])
            old = entry[field][i]
            entry[field][i] = old + value if how == "nudge" and isinstance(old, int) else value
    return h


def test_fuzz_safetensors_header(tmp_path: Path, baseline: int) -> None:
    d = tmp_path / "ckpt"
    shutil.copytree(SEED_DIR, d)
    seed = d / "model.safetensors"
    header, data = read_safetensors(seed)
    names = [n for n in header if n != "__metadata__"]

    @SETTINGS
    @given(edits=header_mutation(names))
    def case(edits: list[tuple[str, str, object]]) -> None:
        raw = json.dumps(mutate_header(header, edits)).encode()
        seed.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
        exercise(d)

    case()
    check_memory(baseline)


# -- quantization configs -----------------------------------------------------------------------

CONFIG_SEEDS = [
    "gptqmodel-gptq-w4g128-asym-v2",
    "ct-pack-w4a16-g128-asym",
    "bnb4-nf4",
    "gptqmodel-awq-w4g128-sym",
    "hf-fp8-block128-dyn",
]


def quant_config_of(d: Path) -> tuple[Path, dict, str | None]:
    """The file holding the quantization config, the whole document, and the key it sits under
    (None: the file is the config)."""
    cfg = json.loads((d / "config.json").read_text())
    if "quantization_config" in cfg:
        return d / "config.json", cfg, "quantization_config"
    for side in ("quantize_config.json", "quantization_config.json", "quant_config.json"):
        if (d / side).exists():
            return d / side, json.loads((d / side).read_text()), None
    raise AssertionError(f"{d}: no quantization config found")


@st.composite
def config_mutation(draw: st.DrawFn, keys: list[str]) -> list[tuple[str, str, object]]:
    """Edits of a quantization config: a known key's value replaced by any JSON value (or one of
    the type confusions users make: a string, a float, a bool, a list), deleted, or nested one
    level deeper into a dict it holds."""
    edits = []
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(keys))
        how = draw(st.sampled_from(["json", "delete", "confuse"]))
        value = draw(
            JSON_VALUES
            if how == "json"
            else st.sampled_from(["4", 4.7, True, [4], {"bits": 4}, -1, 0, 2**70, "re:(a+)+$"])
        )
        edits.append((key, how, value))
    return edits


@pytest.mark.parametrize("variant", CONFIG_SEEDS)
def test_fuzz_quantization_config(variant: str, tmp_path: Path, baseline: int) -> None:
    d = tmp_path / variant
    shutil.copytree(INTEROP / variant, d)
    (d / "reference.safetensors").unlink()
    where, doc, key = quant_config_of(d)
    qc = doc[key] if key else doc
    keys = sorted(qc)
    nested = [f"{k}.{j}" for k, v in qc.items() if isinstance(v, dict) for j in v]

    @settings(SETTINGS, max_examples=150)
    @given(edits=config_mutation(keys + nested))
    def case(edits: list[tuple[str, str, object]]) -> None:
        new = json.loads(json.dumps(doc))
        target = new[key] if key else new
        for path, how, value in edits:
            parent, leaf = target, path
            if "." in path:
                head, leaf = path.split(".", 1)
                parent = target.get(head)
                if not isinstance(parent, dict):
                    continue
            if how == "delete":
                parent.pop(leaf, None)
            else:
                parent[leaf] = value
        where.write_text(json.dumps(new))
        exercise(d)

    case()
    check_memory(baseline)
