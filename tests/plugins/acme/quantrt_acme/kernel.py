"""Acme's one kernel: int8 per-channel weights, activations in fp32 or bf16."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quantrt.canonical import int_codes
from quantrt.kernels import Kernel, Verdict, check
from quantrt.prepared import ALL_M, Strategy


@dataclass(frozen=True)
class Layout:
    q: torch.Tensor  # int8 [N, K], the codes minus their offset of 128
    scale: torch.Tensor  # fp32 [N]
    out_dtype: torch.dtype


def gemv(lay: Layout, x, bias, out, ws):
    """One row: int8 codes times the activations in fp32, scaled per output channel."""
    y = torch.mv(lay.q.float(), x[0].float()).mul_(lay.scale).unsqueeze(0)
    return finish(y, bias, out, lay.out_dtype)


def gemm(lay: Layout, x, bias, out, ws):
    """Many rows: dequantize the weight once per call, then one matmul."""
    y = x.float() @ (lay.q.float() * lay.scale[:, None]).T
    return finish(y, bias, out, lay.out_dtype)


def finish(y, bias, out, dtype):
    if bias is not None:
        y = y + bias.float()
    return out.copy_(y) if out is not None else y.to(dtype)


class AcmeW8A16(Kernel):
    name = "acme.w8a16"
    act_dtypes = (torch.float32, torch.bfloat16)
    description = "symmetric int8 per-channel weights, fp32 arithmetic"

    @classmethod
    def can_implement(cls, spec, caps) -> Verdict:
        s = spec.scheme
        return check(
            (s.weight == "int" and s.bits == 8 and s.symmetric, "symmetric int8 weights", {"weight": s.name}),
            (s.weight_only and s.granularity == "channel", "weight-only, per channel", {"scheme": s.name}),
            ("int8_dot" in caps.features, "an Acme device with int8 dot units", {"features": caps.features}),
        )

    def prepare(self, weight, spec):
        q = (int_codes(weight) - 128).to(torch.int8)
        layout = Layout(q, weight["scales"].float().reshape(-1), spec.output_dtype)
        strategies = [
            Strategy(1, "gemv (int8 codes, fp32)", gemv),
            Strategy(ALL_M, "dequantize + matmul", gemm),
        ]
        return self.prepared(layout, strategies, spec, q.device)
