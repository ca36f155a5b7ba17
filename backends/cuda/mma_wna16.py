"""W4A16 and W8A16 on NVIDIA tensor cores: CUDA C++ (``kernels/wna16_mma.cu``) through CuPy.

Small M (decode) is bound by streaming the weights, so the weights are repacked once into the
lane order of mma.sync's B fragments (``wna16_layout.py``) and a block's warps split K, reducing
through shared memory: one launch per call, no workspace, no atomics. Large M is bound by
arithmetic, where cuBLAS is hard to beat: a CUDA pass writes the dequantized weight slice by
slice into a bounded scratch buffer and cuBLAS multiplies it (the way exllama serves prefill).
Tile shapes per M bucket and the M where the dense path takes over come from
``tunings/wna16_mma_<arch>.json``; ``prepare`` compiles the instantiations it needs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

import torch

from quantrt.canonical import CanonicalWeight, act_order_perm
from quantrt.kernels import Kernel, Verdict, check
from quantrt.specs import LayerSpec

from .wna16_layout import KC, TG, group_params, repack_codes

SOURCE = "wna16_mma.cu"
SMEM_LIMIT = 48 * 1024
CT = {torch.float16: "__half", torch.bfloat16: "__nv_bfloat16"}


def tuning(arch: str) -> dict[str, Any]:
    base = resources.files("quantrt.backends.cuda") / "tunings"
    for name in (f"wna16_mma_{arch}.json", "wna16_mma_default.json"):
        path = base / name
        if path.is_file():
            return json.loads(path.read_text())
    raise FileNotFoundError(
        "quantrt.backends.cuda.tunings/wna16_mma_default.json is missing from the install"
    )


def groups_per_chunk(bits: int, group: int | None) -> int:
    """1 when a group spans whole chunks, else chunks hold KC/group groups; 0 if neither fits."""
    kc = KC[bits]
    if group is None or group % kc == 0:
        return 1
    if kc % group == 0 and group % 16 == 0:
        return kc // group
    return 0


@dataclass(frozen=True)
class Tile:
    """One launch shape of the small-M kernel."""

    max_m: int
    mt: int  # m16 tiles per block
    nt: int  # n8 tiles per block
    wk: int  # warps per block, splitting K
    stages: int  # depth of each warp's asynchronous-copy ring
    fn: Any  # the compiled kernel
    smem: int  # dynamic shared memory per block


def tile_smem(mt: int, nt: int, wk: int, stages: int, gpc: int, sz_bytes: int) -> int:
    """Bytes of the copy rings (codes + group parameters), or of the reduction if that is larger."""
    ring = stages * (nt * 512 + -(-nt * gpc * 32 * sz_bytes // 16) * 16)
    return wk * max(ring, 16 * mt * 8 * nt * 4)


@dataclass
class MmaState:
    w: torch.Tensor  # uint8 [Npad/8, chunks, 32, 16]
    sz: torch.Tensor
    perm: torch.Tensor | None
    N: int
    K: int
    n_pad: int
    chunks: int
    group: int
    tiles: tuple[Tile, ...]
    dense_fn: Any
    slice_chunks: int  # chunks dequantized per cuBLAS call on the dense path
    act: torch.dtype
    out_dtype: torch.dtype
    device: int
    bits: int
    gpc: int


class CudaMmaWNA16(Kernel):
    """Integer weight-only matmul on tensor cores; weights repacked to B-fragment lane order."""

    backend = "cuda"
    device_kinds = ("cuda",)
    priority = 30
    bits = 4

    @classmethod
    def supports(cls, spec: LayerSpec, caps: Any) -> Verdict:
        s = spec.scheme
        group = s.group_size if s.granularity == "group" else None
        return check(
            ((caps.sm or 0) >= 80, "sm >= 80 (mma.sync bf16)", {"sm": caps.sm}),
            (
                "cupy" in caps.libraries,
                "cupy importable (NVRTC compiles the kernel)",
                {"libraries": caps.libraries},
            ),
            (
                s.weight == "int" and s.bits == cls.bits,
                f"{cls.bits}-bit integer weights",
                {"weight": s.weight, "bits": s.bits},
            ),
            (s.weight_only, "weight-only scheme", {"act": s.act}),
            (
                s.granularity in ("group", "channel"),
                "group or channel scales",
                {"granularity": s.granularity},
            ),
            (
                groups_per_chunk(cls.bits, group) > 0,
                f"group size a multiple of {KC[cls.bits]} or 16..{KC[cls.bits]} dividing it",
                {"group_size": group},
            ),
            (spec.K_part % 2 == 0, "K even (inputs are read in pairs)", {"K": spec.K_part}),
            (spec.op == "linear", "op == 'linear'", {"op": spec.op}),
            (
                spec.act_dtype in CT,
                "activations bf16 or fp16",
                {"act_dtype": spec.act_dtype},
            ),
            (
                not s.act_order or spec.k_full,
                "act-order with the full K on this rank",
                {"K_part": spec.K_part, "K": spec.K},
            ),
        )

    def prepare(self, weight: CanonicalWeight, spec: LayerSpec) -> MmaState:
        from .cupy_kernels import function, launcher

        s = weight.scheme
        bits = self.bits
        group = s.group_size if s.granularity == "group" else None
        perm = act_order_perm(weight, group or weight.K)
        q = weight["qweight"]
        dev = q.device.index if q.device.index is not None else torch.cuda.current_device()
        N, K = weight.N, weight.K
        act = spec.act_dtype
        packed = repack_codes(q, bits, N, K, perm)
        gp = group_params(weight["scales"], weight.get("zeros"), bits, K, group, act)
        chunks = packed.shape[1]
        n_pad = packed.shape[0] * TG * 8
        gpc = groups_per_chunk(bits, group)
        table = tuning(
            f"sm_{torch.cuda.get_device_capability(dev)[0]}{torch.cuda.get_device_capability(dev)[1]}"
        )
        sms = torch.cuda.get_device_properties(dev).multi_processor_count
        limit = smem_limit(dev)
        tiles = tuple(
            make_tile(act, bits, gpc, dev, int(row["max_m"]), int(row["mt"]), int(row["nt"]),
                      pick_warps(n_pad, chunks, sms, row, limit, gpc, sz_bytes(act, bits)),
                      int(row.get("stages", 4)))
            for row in table["small_m"]
        )  # fmt: skip
        dense_fn = launcher(function(SOURCE, dense_expr(act, bits, gpc), dev))
        budget = int(table.get("dense_workspace_mb", 256)) << 20
        slice_chunks = max(1, min(chunks, budget // (2 * N * KC[bits])))
        return MmaState(
            packed, gp.sz, None if perm is None else perm.to(q.device), N, K, n_pad, chunks, gp.group, tiles,
            dense_fn, slice_chunks, act, spec.output_dtype, dev, bits, gpc,
        )  # fmt: skip

    def workspace_bytes(self, spec: LayerSpec, max_m: int) -> int:
        return 0  # the dense path's scratch comes from torch's allocator, at most dense_workspace_mb

    def strategy(self, state: MmaState, m: int) -> str:
        tile = self._tile(state, m)
        if tile is None:
            k = state.slice_chunks * KC[state.bits]
            return f"dequant+cuBLAS (K slices of {min(k, state.K)})"
        return f"mma MT{tile.mt} NT{tile.nt} WK{tile.wk}"

    @staticmethod
    def _tile(state: MmaState, m: int) -> Tile | None:
        for tile in state.tiles:
            if m <= tile.max_m:
                return tile
        return None

    def apply(
        self,
        state: MmaState,
        x: torch.Tensor,
        bias: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if torch.compiler.is_compiling():
            y = torch.ops.quantrt.wna16_mma(x.to(state.act), state.w, state.sz, state.perm, bias, meta(state))
        else:
            y = run(state, x, bias, out)
        return y if y.dtype == state.out_dtype else y.to(state.out_dtype)


def sz_bytes(act: torch.dtype, bits: int) -> int:
    return 8 if (act == torch.bfloat16 and bits == 8) else 4


def smem_limit(dev: int) -> int:
    props = torch.cuda.get_device_properties(dev)
    return int(getattr(props, "shared_memory_per_block_optin", SMEM_LIMIT))


def make_tile(
    act: torch.dtype, bits: int, gpc: int, dev: int, max_m: int, mt: int, nt: int, wk: int, stages: int
) -> Tile:
    from .cupy_kernels import function, launcher

    fn = function(SOURCE, tile_expr(act, bits, mt, nt, gpc, stages, max_m), dev)
    wk = max(1, min(wk, fn.max_threads_per_block // 32))  # registers bound the block size
    smem = tile_smem(mt, nt, wk, stages, gpc, sz_bytes(act, bits))
    return Tile(max_m, mt, nt, wk, stages, launcher(fn), smem)


def pick_warps(n_pad: int, chunks: int, sms: int, row: dict[str, Any], limit: int, gpc: int, szb: int) -> int:
    """Warps per block: the tuned count if given, else enough warps on the GPU to keep loads in
    flight; at most one per chunk and what shared memory allows."""
    mt, nt, stages = int(row["mt"]), int(row["nt"]), int(row.get("stages", 4))
    blocks = max(1, n_pad // (8 * nt))
    want = int(row["wk"]) if "wk" in row else -(-int(row.get("warps_per_sm", 16)) * sms // blocks)
    per_warp = tile_smem(mt, nt, 1, stages, gpc, szb)
    cap = min(int(row.get("max_wk", 16)), limit // per_warp, 32, chunks)
    return max(1, min(want, cap))


def run(
    state: MmaState, x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None
) -> torch.Tensor:
    """``y = x @ W.T (+ bias)``: the launch path, kept free of anything that is not needed per call."""
    from .cupy_kernels import stream

    M = x.shape[0]
    if state.perm is not None:
        x = x.index_select(1, state.perm)
    if x.dtype != state.act:
        x = x.to(state.act)
    if x.stride(1) != 1 or x.stride(0) % 2 or x.data_ptr() % 4:
        x = x.contiguous()
    if bias is not None and bias.dtype != state.act:
        bias = bias.to(state.act)
    tile = None
    for t in state.tiles:
        if M <= t.max_m:
            tile = t
            break
    if tile is None:
        return _dense(state, x, bias, out)
    if out is None or out.dtype != state.act or out.stride(1) != 1:
        y = torch.empty(M, state.N, dtype=state.act, device=x.device)
    else:
        y = out
    if M:
        tile.fn(
            (state.n_pad // (8 * tile.nt), -(-M // (16 * tile.mt)), 1),
            (32 * tile.wk, 1, 1),
            (
                x.data_ptr(),
                state.w.data_ptr(),
                state.sz.data_ptr(),
                0 if bias is None else bias.data_ptr(),
                y.data_ptr(),
                M,
                state.K,
                x.stride(0),
                y.stride(0),
                state.N,
                state.n_pad,
                state.chunks,
                state.group,
            ),
            shared_mem=tile.smem,
            stream=stream(state.device),
        )
    if out is not None and y is not out:
        out.copy_(y)
        return out
    return y


def _dense(
    state: MmaState, x: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor | None
) -> torch.Tensor:
    """Large M: dequantize K slices into scratch and let cuBLAS multiply each."""
    from .cupy_kernels import stream

    kc = KC[state.bits]
    width = state.slice_chunks * kc
    scratch = torch.empty(state.N, width, dtype=state.act, device=x.device)
    y = out
    for c0 in range(0, state.chunks, state.slice_chunks):
        cnt = min(state.slice_chunks, state.chunks - c0)
        k0, k1 = c0 * kc, min(state.K, (c0 + cnt) * kc)
        items = -(-state.N // 8) * cnt
        state.dense_fn(
            (-(-items // 8), 1, 1),
            (256, 1, 1),
            (
                state.w.data_ptr(),
                state.sz.data_ptr(),
                scratch.data_ptr(),
                state.N,
                state.K,
                state.n_pad,
                state.chunks,
                c0,
                cnt,
                width,
                state.group,
            ),
            stream=stream(state.device),
        )
        w = scratch[:, : k1 - k0]
        xs = x[:, k0:k1]
        if y is None:
            y = torch.nn.functional.linear(xs, w, bias)
        elif c0 == 0:
            if bias is None:
                torch.mm(xs, w.t(), out=y)
            else:
                torch.addmm(bias, xs, w.t(), out=y)
        else:
            y.addmm_(xs, w.t())
    return y


def meta(state: MmaState) -> list[int]:
    """The state's integers, for the traced op (its tensors travel as op inputs)."""
    flat = [
        state.N,
        state.K,
        state.bits,
        state.group,
        state.chunks,
        state.n_pad,
        state.slice_chunks,
        state.device,
    ]
    flat.append(state.gpc)
    for t in state.tiles:
        flat += [t.max_m, t.mt, t.nt, t.wk, t.stages]
    return flat


def from_meta(
    w: torch.Tensor, sz: torch.Tensor, perm: torch.Tensor | None, m: list[int], act: torch.dtype
) -> MmaState:
    from .cupy_kernels import function, launcher

    N, K, bits, group, chunks, n_pad, slice_chunks, dev, gpc = m[:9]
    rows = [m[i : i + 5] for i in range(9, len(m), 5)]
    tiles = tuple(make_tile(act, bits, gpc, dev, mm, mt, nt, wk, st) for mm, mt, nt, wk, st in rows)
    dense = launcher(function(SOURCE, dense_expr(act, bits, gpc), dev))
    return MmaState(
        w, sz, perm, N, K, n_pad, chunks, group, tiles, dense, slice_chunks, act, act, dev, bits, gpc
    )


def tile_expr(act: torch.dtype, bits: int, mt: int, nt: int, gpc: int, stages: int, max_m: int) -> str:
    rows8 = "true" if max_m <= 8 else "false"
    return f"wna16_mma<{CT[act]}, {bits}, {mt}, {nt}, {gpc}, {stages}, {rows8}>"


def dense_expr(act: torch.dtype, bits: int, gpc: int) -> str:
    return f"wna16_dequant<{CT[act]}, {bits}, {gpc}>"


@torch.library.custom_op("quantrt::wna16_mma", mutates_args=())
def wna16_mma_op(
    x: torch.Tensor,
    w: torch.Tensor,
    sz: torch.Tensor,
    perm: torch.Tensor | None,
    bias: torch.Tensor | None,
    meta: list[int],
) -> torch.Tensor:
    """The launcher as a torch op, so torch.compile traces through it (eager calls skip the op layer)."""
    return run(from_meta(w, sz, perm, meta, x.dtype), x, bias, None)


@wna16_mma_op.register_fake
def _wna16_mma_fake(
    x: torch.Tensor,
    w: torch.Tensor,
    sz: torch.Tensor,
    perm: torch.Tensor | None,
    bias: torch.Tensor | None,
    meta: list[int],
) -> torch.Tensor:
    return x.new_empty(x.shape[0], meta[0])


class CudaMmaW4A16(CudaMmaWNA16):
    name = "cuda.mma_w4a16"
    description = "CUDA int4 weight-only on tensor cores (mma.sync, lane-order repack); cuBLAS on dequantized slices for large M"
    bits = 4


class CudaMmaW8A16(CudaMmaWNA16):
    name = "cuda.mma_w8a16"
    description = "CUDA int8 weight-only on tensor cores (mma.sync, lane-order repack); cuBLAS on dequantized slices for large M"
    bits = 8
