"""The direct launcher (backends/triton/launch.py) against torch: every specialization Triton would
pick (pointer alignment, ints equal to 1 or divisible by 16, constexprs, options) gets its own
binary, and a repeated call reuses it. Under the interpreter the launcher is Triton's own path."""

import pytest
import torch
import triton
import triton.language as tl

from quantrt.backends.triton.launch import Launcher, cdiv, next_power_of_2

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@triton.jit
def _axpb_kernel(X, Y, n, stride, a, B: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(Y + i, tl.load(X + i * stride, mask=m) * a + B, mask=m)


_axpb = Launcher(_axpb_kernel)


@pytest.mark.parametrize("n", [1, 5, 16, 100, 1000])
def test_helpers_match_triton(n):
    for d in (1, 3, 16, 64):
        assert cdiv(n, d) == triton.cdiv(n, d)
    assert next_power_of_2(n) == triton.next_power_of_2(n)


def test_launcher_matches_torch_across_specializations():
    base = torch.randn(4096, device=DEV)
    cases = [  # (x view, stride, n, a, B, BLOCK, num_warps)
        (base, 1, 1000, 2.0, 0.0, 128, 4),
        (base, 1, 1000, -0.5, 0.0, 128, 4),  # same binary, other float
        (base, 1, 1024, 2.0, 0.0, 128, 4),  # n divisible by 16
        (base, 2, 1000, 2.0, 0.0, 128, 4),  # stride != 1
        (base[1:], 1, 999, 2.0, 0.0, 128, 4),  # x not 16-byte aligned
        (base, 1, 1000, 2.0, 3.0, 128, 4),  # another constexpr
        (base, 1, 1000, 2.0, 0.0, 64, 2),  # another block and option
        (base, 1, 1, 1.5, 1.0, 128, 4),  # n == 1
    ]
    for rnd in range(2):  # the second round runs every case from the launcher's cache
        if rnd == 1:
            direct = _axpb.direct_launches
        for x, stride, n, a, b, block, warps in cases:
            y = torch.full((n,), float("nan"), device=DEV)
            _axpb((cdiv(n, block),), x, y, n, stride, a, B=b, BLOCK=block, num_warps=warps)
            ref = x[: n * stride : stride] * a + b
            torch.testing.assert_close(y, ref, rtol=1e-6, atol=1e-6)
    if DEV == "cuda":
        # one binary per distinct specialization: the float and a repeated case add none
        assert len(_axpb._hits) == len(cases) - 1
        assert _axpb.direct_launches - direct == len(cases)  # no launch went back through Triton
