"""Tiny MoE GGUF files (qwen3moe, qwen2moe with a shared expert, gpt-oss), written by gguf-py's
GGUFWriter with the tensor names, shapes and metadata keys llama.cpp's converter writes.

Each ``write_*`` function writes a two-layer model (hidden 64, ``E`` = 4 experts, top-k 2, a
128-token vocabulary with a minimal gpt2-style tokenizer) whose weights are ``normal * 0.02``
from a fixed seed (norm weights ``1 + normal * 0.02``), with the expert stacks
(``blk.L.ffn_{gate,up,down}_exps.weight``, numpy shape [E, N, K]) in ``expert_type`` (Q8_0,
Q4_0, MXFP4 ... through ``gguf.quants.quantize``, or F16/F32) and the other 2-D weights in
``dense_type`` (F32 by default; routers, norms and biases always F32).

What transformers 5's own GGUF path (``AutoModelForCausalLM.from_pretrained(dir, gguf_file=name)``,
the legacy ``load_gguf_checkpoint`` loader for these three architectures) makes of them:

* qwen3moe / qwen2moe load. Its config ignores ``expert_feed_forward_length`` and
  ``expert_shared_feed_forward_length``, so its model takes those sizes from the config class
  defaults (Qwen3Moe 768; Qwen2Moe 1408, shared expert 5632) and refuses a file of other sizes
  (size mismatch); the files use exactly those sizes by default (smaller ones suit quantrt and
  ``load_gguf_checkpoint(..., return_tensors=False)``). Every tensor is dequantized by gguf-py to
  float32; ``ffn_gate_exps``/``ffn_up_exps`` [E, I, H] fill ``mlp.experts.gate_up_proj``
  [E, 2I, H] (gate rows 0..I-1, up rows I..2I-1, concatenated, no transpose), ``ffn_down_exps``
  is ``mlp.experts.down_proj`` [E, H, I] as stored, ``ffn_gate_inp_shexp`` [H] becomes
  ``mlp.shared_expert_gate.weight`` [1, H].
* gpt-oss loads, but with its expert parameters and attention sinks left at their random
  initialisation (load report "MISSING"): transformers looks its tensor processor up under
  ``gpt_oss`` while the file says ``gpt-oss``, and gguf-py's table maps neither the stacks to the
  fused ``gate_up_proj`` nor the bare ``sinks`` parameter to ``attn_sinks.weight``. Files with
  llama.cpp's ``rope.scaling.*`` keys do not load at all (transformers reads each key's length
  field as its value), so :func:`write_gpt_oss` writes them only when asked. Use
  :func:`transformers_model`, which fills the missing parameters from the file
  (:func:`expected_gpt_oss_state`), to get the transformers model the file stands for.

No test functions live here: the tests that use these files import them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

H, NH, NKV, V, L = 64, 4, 2, 128, 2
E, TOP_K = 4, 2
QWEN3_HEAD_DIM = 16
#: transformers' config class defaults for the sizes its GGUF loader does not read
QWEN3MOE_I = 768
QWEN2MOE_I, QWEN2MOE_SHARED_I = 1408, 5632
#: gpt-oss: transformers reads the expert size from feed_forward_length, but neither the head size
#: nor the sliding window (GptOssConfig's defaults, 64 and 128, stand)
GPT_OSS_I, GPT_OSS_HEAD_DIM, GPT_OSS_WINDOW = 64, 64, 128


def _gguf() -> Any:
    import gguf

    return gguf


class _Writer:
    """gguf-py's writer with a seeded generator and each tensor's type chosen by role."""

    def __init__(self, path: Path, arch: str, seed: int, expert_type: Any, dense_type: Any) -> None:
        gguf = _gguf()
        self.gguf = gguf
        self.w = gguf.GGUFWriter(str(path), arch)
        self.rng = np.random.default_rng(seed)
        self.expert_type = (
            gguf.GGMLQuantizationType[expert_type] if isinstance(expert_type, str) else expert_type
        )
        self.dense_type = gguf.GGMLQuantizationType[dense_type] if isinstance(dense_type, str) else dense_type
        self.path = path

    def add(self, name: str, shape: tuple[int, ...], qtype: Any = None, *, norm: bool = False) -> None:
        a = (self.rng.standard_normal(shape) * 0.02).astype(np.float32)
        if norm:
            a += 1.0
        self.put(name, a, qtype)

    def put(self, name: str, a: np.ndarray, qtype: Any = None) -> None:
        GT = self.gguf.GGMLQuantizationType
        qtype = GT.F32 if qtype is None else qtype
        if qtype == GT.F32:
            self.w.add_tensor(name, a.astype(np.float32))
        elif qtype == GT.F16:
            self.w.add_tensor(name, a.astype(np.float16))
        else:
            self.w.add_tensor(name, self.gguf.quants.quantize(a, qtype), raw_dtype=qtype)

    def header(self, *, ff: int, head_dim: int | None) -> None:
        w = self.w
        w.add_name("tiny-moe")
        w.add_block_count(L)
        w.add_context_length(256)
        w.add_embedding_length(H)
        w.add_feed_forward_length(ff)
        w.add_head_count(NH)
        w.add_head_count_kv(NKV)
        w.add_layer_norm_rms_eps(1e-6)
        w.add_rope_freq_base(10000.0)
        w.add_expert_count(E)
        w.add_expert_used_count(TOP_K)
        w.add_vocab_size(V)
        if head_dim is not None:
            w.add_key_length(head_dim)
            w.add_value_length(head_dim)
        # a minimal gpt2-style (byte-level BPE) tokenizer: bytes 0..126 as single characters (0..31
        # spelled as byte-level BPE spells them), token 127 = "ab" from the one merge "a b"
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("qwen2")
        w.add_token_list([chr(0x100 + i) if i < 32 else chr(i) for i in range(V - 1)] + ["ab"])
        w.add_token_types([1] * V)
        w.add_token_merges(["a b"])
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)

    def globals(self) -> None:
        self.add("token_embd.weight", (V, H), self.dense_type)
        self.add("output_norm.weight", (H,), norm=True)
        self.add("output.weight", (V, H), self.dense_type)

    def experts(self, b: str, inter: int, *, bias: bool = False) -> None:
        for proj, shape in (("gate", (E, inter, H)), ("up", (E, inter, H)), ("down", (E, H, inter))):
            self.add(f"{b}ffn_{proj}_exps.weight", shape, self.expert_type)
            if bias:
                self.add(f"{b}ffn_{proj}_exps.bias", (E, shape[1]))

    def close(self) -> Path:
        w = self.w
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return self.path


def write_qwen3moe(
    path: str | Path,
    *,
    expert_type: Any = "Q8_0",
    dense_type: Any = "F32",
    seed: int = 0,
    moe_intermediate_size: int = QWEN3MOE_I,
) -> Path:
    """A qwen3moe file: q/k norms, no attention bias, ``E`` experts, no shared expert."""
    w = _Writer(Path(path), "qwen3moe", seed, expert_type, dense_type)
    w.header(ff=96, head_dim=QWEN3_HEAD_DIM)
    w.w.add_expert_feed_forward_length(moe_intermediate_size)
    w.globals()
    q, kv = NH * QWEN3_HEAD_DIM, NKV * QWEN3_HEAD_DIM
    for i in range(L):
        b = f"blk.{i}."
        w.add(b + "attn_norm.weight", (H,), norm=True)
        w.add(b + "attn_q.weight", (q, H), w.dense_type)
        w.add(b + "attn_k.weight", (kv, H), w.dense_type)
        w.add(b + "attn_v.weight", (kv, H), w.dense_type)
        w.add(b + "attn_output.weight", (H, q), w.dense_type)
        w.add(b + "attn_q_norm.weight", (QWEN3_HEAD_DIM,), norm=True)
        w.add(b + "attn_k_norm.weight", (QWEN3_HEAD_DIM,), norm=True)
        w.add(b + "ffn_norm.weight", (H,), norm=True)
        w.add(b + "ffn_gate_inp.weight", (E, H))
        w.experts(b, moe_intermediate_size)
    return w.close()


def write_qwen2moe(
    path: str | Path,
    *,
    expert_type: Any = "Q8_0",
    dense_type: Any = "F32",
    seed: int = 0,
    moe_intermediate_size: int = QWEN2MOE_I,
    shared_intermediate_size: int = QWEN2MOE_SHARED_I,
) -> Path:
    """A qwen2moe file: q/k/v biases, ``E`` experts and a sigmoid-gated shared expert (its gate
    ``ffn_gate_inp_shexp.weight`` stored 1-D [H], as llama.cpp writes it)."""
    w = _Writer(Path(path), "qwen2moe", seed, expert_type, dense_type)
    w.header(ff=96, head_dim=None)
    w.w.add_expert_feed_forward_length(moe_intermediate_size)
    w.w.add_expert_shared_feed_forward_length(shared_intermediate_size)
    w.globals()
    hd = H // NH
    q, kv = NH * hd, NKV * hd
    for i in range(L):
        b = f"blk.{i}."
        w.add(b + "attn_norm.weight", (H,), norm=True)
        for n, rows in (("attn_q", q), ("attn_k", kv), ("attn_v", kv)):
            w.add(f"{b}{n}.weight", (rows, H), w.dense_type)
            w.add(f"{b}{n}.bias", (rows,))
        w.add(b + "attn_output.weight", (H, q), w.dense_type)
        w.add(b + "ffn_norm.weight", (H,), norm=True)
        w.add(b + "ffn_gate_inp.weight", (E, H))
        w.experts(b, moe_intermediate_size)
        w.add(b + "ffn_gate_inp_shexp.weight", (H,))
        w.add(b + "ffn_gate_shexp.weight", (shared_intermediate_size, H), w.dense_type)
        w.add(b + "ffn_up_shexp.weight", (shared_intermediate_size, H), w.dense_type)
        w.add(b + "ffn_down_shexp.weight", (H, shared_intermediate_size), w.dense_type)
    return w.close()


def write_gpt_oss(
    path: str | Path,
    *,
    expert_type: Any = "MXFP4",
    dense_type: Any = "F32",
    seed: int = 0,
    intermediate_size: int = GPT_OSS_I,
    rope_scaling: bool = False,
    sliding_window: int = GPT_OSS_WINDOW,
) -> Path:
    """A gpt-oss file as llama.cpp's converter writes one: gate and up stacks de-interleaved
    (``ffn_gate_exps`` = HF gate_up_proj rows 0::2, transposed to [E, I, H]) with their biases
    [E, I], ``ffn_down_exps`` [E, H, I] + bias [E, H], router ``ffn_gate_inp`` weight + bias,
    attention biases, ``attn_sinks.weight`` [n_head], ``post_attention_norm``, sliding window and
    yarn rope scaling metadata."""
    w = _Writer(Path(path), "gpt-oss", seed, expert_type, dense_type)
    w.header(ff=intermediate_size, head_dim=GPT_OSS_HEAD_DIM)
    w.w.add_expert_feed_forward_length(intermediate_size)
    w.w.add_sliding_window(sliding_window)
    if rope_scaling:
        w.w.add_rope_scaling_type(w.gguf.RopeScalingType.YARN)
        w.w.add_rope_scaling_factor(32.0)
        w.w.add_rope_scaling_orig_ctx_len(4096)
    w.globals()
    q, kv = NH * GPT_OSS_HEAD_DIM, NKV * GPT_OSS_HEAD_DIM
    for i in range(L):
        b = f"blk.{i}."
        w.add(b + "attn_norm.weight", (H,), norm=True)
        for n, rows in (("attn_q", q), ("attn_k", kv), ("attn_v", kv)):
            w.add(f"{b}{n}.weight", (rows, H), w.dense_type)
            w.add(f"{b}{n}.bias", (rows,))
        w.add(b + "attn_output.weight", (H, q), w.dense_type)
        w.add(b + "attn_output.bias", (H,))
        w.add(b + "attn_sinks.weight", (NH,))
        w.add(b + "post_attention_norm.weight", (H,), norm=True)
        w.add(b + "ffn_gate_inp.weight", (E, H))
        w.add(b + "ffn_gate_inp.bias", (E,))
        w.experts(b, intermediate_size, bias=True)
    return w.close()


WRITERS: dict[str, Callable[..., Path]] = {
    "qwen3moe": write_qwen3moe,
    "qwen2moe": write_qwen2moe,
    "gpt-oss": write_gpt_oss,
}


def dequantized(path: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of the file as gguf-py dequantizes it (numpy shape, float32)."""
    gguf = _gguf()
    from gguf.quants import dequantize

    return {
        t.name: np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        for t in gguf.GGUFReader(str(path)).tensors
    }


def expected_gpt_oss_state(path: str | Path) -> dict[str, np.ndarray]:
    """The expert and sink parameters of transformers' GptOssForCausalLM that the file stands
    for (transformers' own GGUF loader leaves them unread): ``gate_up_proj`` [E, H, 2I] with gate
    in the even columns and up in the odd ones (transposed from GGUF's [E, I, H]),
    ``gate_up_proj_bias`` [E, 2I] interleaved the same way, ``down_proj`` [E, I, H] (transposed),
    ``down_proj_bias`` [E, H], ``self_attn.sinks`` [n_head]."""
    t = dequantized(path)
    out: dict[str, np.ndarray] = {}
    for i in range(L):
        b, m = f"blk.{i}.", f"model.layers.{i}."
        gate, up = t[b + "ffn_gate_exps.weight"], t[b + "ffn_up_exps.weight"]  # [E, I, H]
        Ex, inter, hid = gate.shape
        gu = np.empty((Ex, hid, 2 * inter), dtype=np.float32)
        gu[..., 0::2], gu[..., 1::2] = gate.transpose(0, 2, 1), up.transpose(0, 2, 1)
        gub = np.empty((Ex, 2 * inter), dtype=np.float32)
        gub[:, 0::2], gub[:, 1::2] = t[b + "ffn_gate_exps.bias"], t[b + "ffn_up_exps.bias"]
        out[m + "mlp.experts.gate_up_proj"] = gu
        out[m + "mlp.experts.gate_up_proj_bias"] = gub
        out[m + "mlp.experts.down_proj"] = t[b + "ffn_down_exps.weight"].transpose(0, 2, 1).copy()
        out[m + "mlp.experts.down_proj_bias"] = t[b + "ffn_down_exps.bias"]
        out[m + "self_attn.sinks"] = t[b + "attn_sinks.weight"]
    return out


def transformers_model(path: str | Path, dtype: Any = None) -> Any:
    """transformers' own GGUF load of the file (float32 unless ``dtype``), with, for gpt-oss, the
    parameters its loader leaves unread (experts, sinks) filled from :func:`expected_gpt_oss_state`."""
    import torch
    import transformers

    path = Path(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=dtype or torch.float32
    )
    if model.config.model_type == "gpt_oss":
        state = {
            k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in expected_gpt_oss_state(path).items()
        }
        _, unexpected = model.load_state_dict(state, strict=False)
        assert not unexpected, unexpected
    return model
