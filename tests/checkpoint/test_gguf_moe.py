"""GGUF MoE files: MXFP4 blocks read as canonical mxfp4, MoE architectures' configs and names.

Oracles: gguf-py 0.19's ``gguf.quants.dequantize`` (llama.cpp's reference dequantizer) for MXFP4
values, compared bit for bit; transformers' own GGUF loader (``load_gguf_checkpoint``,
``get_gguf_hf_weights_map``, ``AutoConfig.from_pretrained(..., gguf_file=...)``) for configs and
tensor names. Files are written by gguf-py's GGUFWriter (the tiny MoE models come from
tests/models/gguf_moe_files.py), raw MXFP4 bytes by hand so every exponent and nibble occurs,
and broken headers by packing GGUF bytes with ``struct``.
"""

from __future__ import annotations

import importlib.util
import math
import struct
from fractions import Fraction
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch

import quantrt
from quantrt.checkpoint.gguf_file import GGUFFile
from quantrt.errors import CheckpointError
from quantrt.formats.gguf import GGUFMXFP4Adapter, open_gguf
from quantrt.formats.gguf_arch import (
    EXTRA_CONFIG_KEYS,
    expert_stack,
    hf_config_dict,
    hf_tensor_names,
    value_fix,
)
from quantrt.schemes import parse_scheme

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")
from gguf import GGMLQuantizationType as GT  # noqa: E402
from gguf.quants import dequantize as gguf_dequantize  # noqa: E402
from transformers.modeling_gguf_pytorch_utils import (  # noqa: E402
    TENSOR_PROCESSORS,
    TensorProcessor,
    get_gguf_hf_weights_map,
    load_gguf_checkpoint,
)


def _helper() -> ModuleType:
    """tests/models/gguf_moe_files.py (importlib mode puts no test folder on sys.path)."""
    path = Path(__file__).resolve().parents[1] / "models" / "gguf_moe_files.py"
    spec = importlib.util.spec_from_file_location("gguf_moe_files", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


gmf = _helper()
ARCHS = ["qwen3moe", "qwen2moe", "gpt-oss"]
#: small expert sizes: quick to write, fine for quantrt and for transformers' config reader
SMALL = {
    "qwen3moe": {"moe_intermediate_size": 64},
    "qwen2moe": {"moe_intermediate_size": 64, "shared_intermediate_size": 96},
    "gpt-oss": {"intermediate_size": 64},
}


# -- helpers --------------------------------------------------------------------------------------


def mxfp4_bytes(shape: tuple[int, ...], K: int, seed: int) -> np.ndarray:
    """Random MXFP4 blocks uint8 [*shape, K/32*17]: any nibbles, exponents 0..254 (all of them
    when there are enough blocks, so the subnormal scales 2^-127, 2^-126 and overflow occur)."""
    rng = np.random.default_rng(seed)
    b = rng.integers(0, 256, (*shape, K // 32, 17), dtype=np.uint8)
    e = rng.integers(0, 255, (*shape, K // 32)).astype(np.uint8)
    n = min(e.size, 255)
    e.reshape(-1)[:n] = np.arange(n, dtype=np.uint8)
    b[..., 0] = e
    return b.reshape(*shape, K // 32 * 17)


def write_mxfp4(path: Path, tensors: dict[str, np.ndarray], arch: str = "qwen3") -> Path:
    w = gguf.GGUFWriter(str(path), arch)
    for name, raw in tensors.items():
        w.add_tensor(name, raw, raw_dtype=GT.MXFP4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def reference(path: Path) -> dict[str, np.ndarray]:
    with np.errstate(over="ignore"):  # E = 254 with |code| >= 2 overflows to inf, in both readers
        return {t.name: gguf_dequantize(t.data, t.tensor_type) for t in gguf.GGUFReader(str(path)).tensors}


def assert_bits_equal(mine: torch.Tensor, expected: np.ndarray, what: str) -> None:
    exp = torch.from_numpy(np.ascontiguousarray(expected, dtype=np.float32))
    assert mine.dtype == torch.float32 and tuple(mine.shape) == tuple(exp.shape), what
    same = mine.view(torch.int32) == exp.view(torch.int32)
    assert bool(same.all()), f"{what}: {int((~same).sum())} fp32 bit patterns differ"


def u32(v: int) -> bytes:
    return struct.pack("<I", v)


def u64(v: int) -> bytes:
    return struct.pack("<Q", v)


def gstr(s: str) -> bytes:
    return u64(len(s.encode())) + s.encode()


def gguf_bytes(tensors: list[tuple[str, tuple[int, ...], int, int]], data: bytes) -> bytes:
    """A GGUF v3 file: general.architecture = qwen3, the given tensor infos, then ``data``."""
    head = (
        b"GGUF" + u32(3) + u64(len(tensors)) + u64(1) + gstr("general.architecture") + u32(8) + gstr("qwen3")
    )
    for name, dims, type_id, offset in tensors:
        head += gstr(name) + u32(len(dims)) + b"".join(u64(d) for d in dims) + u32(type_id) + u64(offset)
    return head + bytes(-len(head) % 32) + data


def weights(path: Path) -> dict[str, Any]:
    return dict(quantrt.open_checkpoint(path).weights())


# -- MXFP4: bit-exact against gguf-py ----------------------------------------------------------------


def test_mxfp4_2d_bit_exact(tmp_path: Path) -> None:
    """Row counts around the 256-row conversion chunk, K of 1 and 3 blocks; code 8 (-0) reads +0."""
    shapes = {
        "blk.0.ffn_up": (1, 32),
        "blk.0.ffn_gate": (7, 96),
        "blk.0.ffn_down": (300, 64),
        "output": (257, 32),
    }
    path = write_mxfp4(
        tmp_path / "m.gguf",
        {f"{n}.weight": mxfp4_bytes((N,), K, seed=i) for i, (n, (N, K)) in enumerate(shapes.items())},
    )
    ref = reference(path)
    got = weights(path)
    prefixes = {
        "blk.0.ffn_up": "model.layers.0.mlp.up_proj",
        "blk.0.ffn_gate": "model.layers.0.mlp.gate_proj",
        "blk.0.ffn_down": "model.layers.0.mlp.down_proj",
        "output": "lm_head",
    }
    for stem, (N, K) in shapes.items():
        w = got[prefixes[stem]]
        assert str(w.scheme) == "w4a16-mxfp4" and w.shape == (N, K)
        assert_bits_equal(w.dequantize(), ref[f"{stem}.weight"], stem)
    assert bool(np.isinf(ref["blk.0.ffn_down.weight"]).any())  # E = 254 overflows in both
    canonical = got["model.layers.0.mlp.down_proj"].canonical()
    assert set(canonical.tensors) == {"qweight", "scales"}
    assert canonical.tensors["qweight"].shape == (300, 32) and canonical.tensors["scales"].shape == (300, 2)
    assert canonical.tensors["scales"].dtype == torch.uint8
    assert not bool(((canonical.tensors["qweight"] & 0xF) == 8).any())  # -0 written as +0
    assert not bool(((canonical.tensors["qweight"] >> 4) == 8).any())


def test_mxfp4_expert_stacks_bit_exact(tmp_path: Path) -> None:
    """Each expert of a 3-D stack reads its own rows; awkward N, and E*N past one chunk."""
    raws = {
        "blk.0.ffn_up_exps.weight": mxfp4_bytes((3, 37), 64, seed=1),
        "blk.0.ffn_down_exps.weight": mxfp4_bytes((2, 300), 32, seed=2),
        "blk.1.ffn_gate_exps.weight": mxfp4_bytes((5, 1), 96, seed=3),
    }
    path = write_mxfp4(tmp_path / "m.gguf", raws)
    ref = reference(path)
    got = weights(path)
    ckpt = quantrt.open_checkpoint(path)
    for name, raw in raws.items():
        stem = name[: -len(".weight")]
        E, N = raw.shape[:2]
        K = raw.shape[2] // 17 * 32
        for e in range(E):
            entry = ckpt.layers[f"{stem}.{e}"]
            assert (entry.kind, entry.N, entry.K, str(entry.scheme)) == ("expert", N, K, "w4a16-mxfp4")
            assert_bits_equal(got[f"{stem}.{e}"].dequantize(), ref[name][e], f"{stem}.{e}")


def test_quantized_gpt_oss_experts_bit_exact(tmp_path: Path) -> None:
    """Experts gguf.quants.quantize wrote (the gpt-oss helper file): every expert, every stack."""
    path = gmf.write_gpt_oss(tmp_path / "g.gguf")
    ref = reference(path)
    got = weights(path)
    n = 0
    for name, r in ref.items():
        if name.endswith("_exps.weight"):
            for e in range(r.shape[0]):
                assert_bits_equal(got[f"{name[: -len('.weight')]}.{e}"].dequantize(), r[e], name)
                n += 1
    assert n == gmf.L * 3 * gmf.E


def test_exponent_255_is_refused(tmp_path: Path) -> None:
    stack = mxfp4_bytes((3, 6), 64, seed=4)
    stack[1].reshape(6, 2, 17)[5, 1, 0] = 255
    stack[1].reshape(6, 2, 17)[5, 0, 0] = 7
    flat = mxfp4_bytes((4,), 96, seed=5)
    flat.reshape(4, 3, 17)[2, 2, 0] = 255
    path = write_mxfp4(
        tmp_path / "bad.gguf", {"blk.0.ffn_up_exps.weight": stack, "blk.0.ffn_up.weight": flat}
    )
    got = weights(path)
    got["blk.0.ffn_up_exps.0"].dequantize()  # the other experts' rows are fine
    got["blk.0.ffn_up_exps.2"].dequantize()
    with pytest.raises(CheckpointError) as err:
        got["blk.0.ffn_up_exps.1"].dequantize()
    msg = str(err.value)
    for part in (
        "bad.gguf",
        "tensor 'blk.0.ffn_up_exps.weight' (expert 1)",
        "1 MXFP4 block(s) have exponent byte 255, first at row 5, block 1",
        "expected an e8m0 exponent 0..254, found 255",
    ):
        assert part in msg, (part, msg)
    with pytest.raises(CheckpointError, match=r"tensor 'blk.0.ffn_up.weight': 1 MXFP4 block.*row 2, block 2"):
        got["model.layers.0.mlp.up_proj"].dequantize()
    with pytest.raises(CheckpointError, match="found 255"):
        quantrt.open_checkpoint(path).linear("model.layers.0.mlp.up_proj")


def test_mxfp4_sizes_are_checked(tmp_path: Path) -> None:
    # the header claims more bytes than the file holds
    path = write_mxfp4(tmp_path / "t.gguf", {"blk.0.ffn_up.weight": mxfp4_bytes((8,), 64, seed=6)})
    start = GGUFFile(path).data_start
    path.write_bytes(path.read_bytes()[: start + 262])
    with pytest.raises(
        CheckpointError, match=r"MXFP4 \[64, 8\] needs bytes \[0, 272\).*holds only 262.*truncated"
    ):
        quantrt.open_checkpoint(path)
    # ne0 not a whole number of blocks
    bad = tmp_path / "ne0.gguf"
    bad.write_bytes(gguf_bytes([("w.weight", (48, 2), 39, 0)], bytes(64)))
    with pytest.raises(
        CheckpointError, match=r"MXFP4 row length ne0=48 is not a whole number of 32-element blocks"
    ):
        quantrt.open_checkpoint(bad)
    # a 3-D stack whose bytes run past the data section
    short = tmp_path / "short.gguf"
    short.write_bytes(gguf_bytes([("blk.0.ffn_up_exps.weight", (32, 4, 2), 39, 0)], bytes(17 * 7)))
    with pytest.raises(CheckpointError, match=r"MXFP4 \[32, 4, 2\] needs bytes \[0, 136\)"):
        quantrt.open_checkpoint(short)
    # the adapter refuses stored bytes of the wrong size
    scheme = parse_scheme("w4a16-mxfp4")
    adapter = GGUFMXFP4Adapter("x.gguf: tensor 'w'")
    with pytest.raises(
        CheckpointError,
        match=r"tensor 'w': MXFP4 for N=4, K=64 must be uint8 \[4, 34\].*found uint8 \[4, 32\]",
    ):
        adapter.to_canonical({"qweight": torch.zeros(4, 32, dtype=torch.uint8)}, scheme, 4, 64, (4,))
    fused = torch.from_numpy(mxfp4_bytes((6,), 64, seed=9))
    fused.view(6, 2, 17)[4, 0, 0] = 255
    with pytest.raises(CheckpointError, match=r"first at row 4 \(row 1 of slice 1\), block 0"):
        adapter.to_canonical({"qweight": fused}, scheme, 6, 64, (3, 3))
    with pytest.raises(CheckpointError, match="needs an mxfp4 scheme"):
        adapter.tensor_specs(parse_scheme("w4a16-nvfp4"), 4, 64)


def test_mxfp4_tensor_specs_and_parallel_cuts(tmp_path: Path) -> None:
    spec = GGUFMXFP4Adapter().tensor_specs(parse_scheme("w4a16-mxfp4"), 8, 64)
    (q,) = spec.values()
    assert (q.name, q.shape, q.dtype) == ("qweight", (8, 34), torch.uint8)
    assert (q.input_dim, q.output_dim, q.input_unit, q.input_align) == (1, 0, Fraction(32, 17), 32)
    # exponents near 127 only, so x @ W^T stays finite
    small = mxfp4_bytes((16,), 64, seed=8)
    small.reshape(16, 2, 17)[..., 0] = np.random.default_rng(0).integers(115, 130, (16, 2))
    path = write_mxfp4(tmp_path / "s.gguf", {"blk.0.ffn_up.weight": small})
    ckpt = quantrt.open_checkpoint(path)
    w = dict(ckpt.weights())["model.layers.0.mlp.up_proj"].dequantize()
    x = torch.randn(3, 64)
    want = x @ w.T
    tol = 1e-4 * float(want.abs().max())
    full = ckpt.linear("model.layers.0.mlp.up_proj", act_dtype=torch.float32)
    assert float((full(x) - want).abs().max()) <= tol
    rows = [
        ckpt.linear(
            "model.layers.0.mlp.up_proj", act_dtype=torch.float32, parallel="row", tp_rank=r, tp_size=2
        )
        for r in range(2)
    ]
    assert float((rows[0](x[:, :32]) + rows[1](x[:, 32:]) - want).abs().max()) <= tol
    cols = [
        ckpt.linear(
            "model.layers.0.mlp.up_proj", act_dtype=torch.float32, parallel="column", tp_rank=r, tp_size=2
        )
        for r in range(2)
    ]
    assert float((torch.cat([c(x) for c in cols], dim=1) - want).abs().max()) <= tol


# -- MoE architectures: configs ------------------------------------------------------------------------


def small_file(tmp_path: Path, arch: str, **kw: Any) -> Path:
    return gmf.WRITERS[arch](tmp_path / f"{arch}.gguf", **{**SMALL[arch], **kw})


def config_of(path: Path) -> dict[str, Any]:
    index, _ = open_gguf(path)
    return hf_config_dict(index.file.metadata, list(index.file.tensors), path)


@pytest.mark.parametrize("arch", ARCHS)
def test_config_equals_transformers(tmp_path: Path, arch: str) -> None:
    """transformers' dict, plus the sizes its table does not read (EXTRA_CONFIG_KEYS), which
    quantrt reads from the file."""
    path = small_file(tmp_path, arch)
    got = config_of(path)
    want = load_gguf_checkpoint(str(path), return_tensors=False)["config"]
    hf_arch = got["model_type"]
    extra = set(EXTRA_CONFIG_KEYS[hf_arch].values())
    assert {k: v for k, v in got.items() if k not in extra or k in want} == want
    sizes = {
        "qwen3moe": {"moe_intermediate_size": 64},
        "qwen2moe": {"moe_intermediate_size": 64, "shared_expert_intermediate_size": 96},
        "gpt-oss": {
            "intermediate_size": 64,
            "head_dim": gmf.GPT_OSS_HEAD_DIM,
            "sliding_window": gmf.GPT_OSS_WINDOW,
        },
    }[arch]
    assert {k: got[k] for k in sizes} == sizes
    experts = got.get("num_experts", got.get("num_local_experts"))
    assert (experts, got["num_experts_per_tok"]) == (gmf.E, gmf.TOP_K)


@pytest.mark.parametrize("arch", ARCHS)
def test_default_size_config_equals_transformers_config(tmp_path: Path, arch: str) -> None:
    """With the sizes transformers assumes, the built configs are the same object by value."""
    from quantrt.models.config import model_config

    path = gmf.WRITERS[arch](tmp_path / f"{arch}.gguf", expert_type="F16")
    mine = model_config(quantrt.open_checkpoint(path)).to_dict()
    theirs = transformers.AutoConfig.from_pretrained(str(tmp_path), gguf_file=path.name).to_dict()
    mine.pop("_name_or_path", None)
    theirs.pop("_name_or_path", None)
    assert mine == theirs


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # transformers' float(array) on these keys
def test_gpt_oss_rope_scaling(tmp_path: Path) -> None:
    """llama.cpp's yarn keys, read as values (transformers reads their length fields instead)."""
    path = small_file(tmp_path, "gpt-oss", rope_scaling=True)
    got = config_of(path)
    assert got["rope_scaling"] == {
        "rope_type": "yarn",
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
    }
    want = load_gguf_checkpoint(str(path), return_tensors=False)["config"]
    same = {k for k in want if k != "rope_scaling"}
    assert {k: got[k] for k in same} == {k: want[k] for k in same}
    from quantrt.models.config import model_config

    rope = model_config(quantrt.open_checkpoint(path)).rope_parameters
    assert (rope["rope_type"], rope["factor"], rope["original_max_position_embeddings"]) == (
        "yarn",
        32.0,
        4096,
    )


def write_metadata(path: Path, arch: str, changes: dict[str, Any]) -> Path:
    """A tensor-less file of ``arch`` with the MoE helper's metadata, ``changes`` applied (None
    removes a key); ints are u32, or u64 past 2^32, or i32 when negative."""
    base: dict[str, Any] = {
        "block_count": 2,
        "context_length": 256,
        "embedding_length": 64,
        "feed_forward_length": 64,
        "attention.head_count": 4,
        "attention.head_count_kv": 2,
        "vocab_size": 128,
        "expert_count": 4,
        "expert_used_count": 2,
        "expert_feed_forward_length": 64,
    }
    meta = {f"{arch}.{k}": v for k, v in base.items()}
    meta.update(changes)
    w = gguf.GGUFWriter(str(path), arch)
    for key, v in meta.items():
        if v is None:
            continue
        if isinstance(v, str):
            w.add_string(key, v)
        elif isinstance(v, float):
            w.add_float32(key, v)
        elif v < 0:
            w.add_int32(key, v)
        elif v >= 1 << 32:
            w.add_uint64(key, v)
        else:
            w.add_uint32(key, v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize(
    ("arch", "changes", "match"),
    [
        (
            "qwen3moe",
            {"qwen3moe.expert_used_count": 5},
            r"'qwen3moe.expert_used_count' is 5, more than the 4 experts",
        ),
        (
            "qwen3moe",
            {"qwen3moe.expert_count": 0},
            r"'num_experts': expected an integer in 1..65536, found 0",
        ),
        ("qwen3moe", {"qwen3moe.expert_count": 1 << 40}, r"'num_experts': .* found 1099511627776"),
        ("qwen3moe", {"qwen3moe.expert_count": None}, r"lacks 'qwen3moe.expert_count'"),
        ("qwen3moe", {"qwen3moe.expert_used_count": 0}, r"'num_experts_per_tok': expected an integer in 1.."),
        (
            "qwen3moe",
            {"qwen3moe.expert_feed_forward_length": 0},
            r"'moe_intermediate_size': expected an integer",
        ),
        (
            "qwen2moe",
            {"qwen2moe.expert_shared_feed_forward_length": 1 << 30},
            r"'shared_expert_intermediate_size'",
        ),
        ("qwen2moe", {"qwen2moe.expert_used_count": None}, r"lacks 'qwen2moe.expert_used_count'"),
        (
            "gpt-oss",
            {"gpt-oss.expert_count": 1 << 20},
            r"'num_local_experts': expected an integer in 1..65536",
        ),
        (
            "gpt-oss",
            {"gpt-oss.expert_feed_forward_length": 96},
            r"expert_feed_forward_length' is 96 but .* 64",
        ),
        ("gpt-oss", {"gpt-oss.attention.key_length": 0}, r"'head_dim': expected an integer"),
        (
            "gpt-oss",
            {"gpt-oss.rope.scaling.type": "linear"},
            r"rope.scaling.type': expected 'yarn'.*'linear'",
        ),
        (
            "gpt-oss",
            {"gpt-oss.rope.scaling.type": "yarn", "gpt-oss.rope.scaling.factor": math.inf},
            r"rope.scaling.factor': expected a finite number",
        ),
        ("gpt-oss", {"tokenizer.ggml.bos_token_id": -1}, r"'bos_token_id': expected a token id"),
    ],
)
def test_bad_moe_sizes_are_refused(tmp_path: Path, arch: str, changes: dict[str, Any], match: str) -> None:
    path = write_metadata(tmp_path / "m.gguf", arch, changes)
    with pytest.raises(CheckpointError, match=match):
        config_of(path)


def test_metadata_only_file_passes(tmp_path: Path) -> None:
    """The refusals above change one key of a file that is otherwise accepted."""
    for arch in ARCHS:
        assert config_of(write_metadata(tmp_path / f"{arch}.gguf", arch, {}))["num_experts_per_tok"] == 2


# -- MoE architectures: layers and names ---------------------------------------------------------------


def test_expert_listing(tmp_path: Path) -> None:
    q3 = quantrt.open_checkpoint(small_file(tmp_path, "qwen3moe", expert_type="Q4_0"))
    inter, H, E = 64, gmf.H, gmf.E
    for proj, (N, K) in (("gate", (inter, H)), ("up", (inter, H)), ("down", (H, inter))):
        for e in range(E):
            entry = q3.layers[f"blk.1.ffn_{proj}_exps.{e}"]
            assert (entry.kind, entry.N, entry.K, str(entry.scheme), entry.bias) == (
                "expert",
                N,
                K,
                "gguf-q4_0",
                None,
            )
            assert entry.select == {"qweight": e}
    router = q3.layers["model.layers.0.mlp.gate"]
    assert (router.kind, router.scheme, router.N, router.K, router.dtype) == (
        "linear",
        None,
        E,
        H,
        torch.float32,
    )
    kinds = {e.kind for e in q3.layers.values()}
    assert kinds == {"expert", "linear", "embedding"}
    assert sum(e.kind == "expert" for e in q3.layers.values()) == gmf.L * 3 * E

    q2 = quantrt.open_checkpoint(small_file(tmp_path, "qwen2moe", expert_type="Q8_0", dense_type="F16"))
    shared = q2.layers["model.layers.1.mlp.shared_expert.down_proj"]
    assert (shared.kind, shared.N, shared.K, shared.dtype) == ("linear", H, 96, torch.float16)
    assert str(q2.layers["blk.0.ffn_down_exps.3"].scheme) == "gguf-q8_0"

    path = small_file(tmp_path, "gpt-oss")
    oss = quantrt.open_checkpoint(path)
    ref = reference(path)
    for proj, n in (("gate", 64), ("up", 64), ("down", H)):
        entry = oss.layers[f"blk.0.ffn_{proj}_exps.2"]
        assert (entry.kind, entry.N, str(entry.scheme)) == ("expert", n, "w4a16-mxfp4")
        assert entry.bias == f"blk.0.ffn_{proj}_exps.bias" and entry.select == {"bias": 2, "qweight": 2}
        bias = oss._read(entry, "bias", entry.bias)
        assert torch.equal(bias, torch.from_numpy(ref[entry.bias][2].copy()))
    router = oss.layers["model.layers.1.mlp.router"]
    assert router.bias == "blk.1.ffn_gate_inp.bias" and (router.N, router.K) == (E, H)


def test_expert_stack() -> None:
    assert expert_stack("blk.0.ffn_gate_exps") == (0, "gate")
    assert expert_stack("blk.17.ffn_up_exps") == (17, "up")
    assert expert_stack("blk.3.ffn_down_exps") == (3, "down")
    assert expert_stack("blk.3.ffn_gate_up_exps") == (3, "gate_up")
    for name in (
        "blk.0.ffn_gate_exps.weight",
        "blk.0.ffn_gate",
        "blk.0.ffn_gate_shexp",
        "ffn_up_exps",
        "blk.x.ffn_up_exps",
    ):
        assert expert_stack(name) is None, name


@pytest.mark.parametrize("arch", ARCHS)
def test_names_equal_transformers(tmp_path: Path, arch: str) -> None:
    """Every non-expert tensor maps to the parameter transformers' map names (gpt-oss's sinks,
    which transformers' map misses, to ``self_attn.sinks``); the expert stacks to nothing, and
    each layer prefix is its tensor's module."""
    from quantrt.models.config import model_config
    from quantrt.models.loader import build_empty

    path = small_file(tmp_path, arch)
    ckpt = quantrt.open_checkpoint(path)
    model = build_empty(model_config(ckpt), torch.float32)
    got = hf_tensor_names(model, arch)
    processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=model.config.to_dict())
    want = get_gguf_hf_weights_map(model, processor)
    params = dict(model.named_parameters())
    stored = list(ckpt.index.names())
    for name in stored:
        stem = name.rsplit(".", 1)[0]
        if expert_stack(stem) is not None:
            assert name not in got, name
            continue
        if name.endswith("attn_sinks.weight"):
            assert want.get(name) is None  # transformers' map: blk.N.attn_sinks, no suffix
            assert got[name] == name.replace("blk.", "model.layers.").replace(
                "attn_sinks.weight", "self_attn.sinks"
            )
        else:
            assert got.get(name) == want.get(name) is not None, name
        t = ckpt.index.read(name)
        fix = value_fix(name, arch)
        if fix is not None:
            t = fix(t)
        assert tuple(t.shape) == tuple(params[got[name]].shape), name
    for prefix, entry in ckpt.layers.items():
        if entry.kind != "expert":
            assert got[next(iter(entry.tensors.values()))] == f"{prefix}.weight", prefix
    assert (value_fix("blk.0.ffn_gate_inp_shexp.weight", arch) is not None) == (arch == "qwen2moe")
