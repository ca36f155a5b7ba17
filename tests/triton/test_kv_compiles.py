"""The KV decode attention kernel (``backends/triton/kv.py``) compiled for sm_90 on the CPU (Triton's
own ptxas, no GPU needed) for every KV format, and the PTX decodes of 4-bit TurboQuant codes
(``backends/cuda/triton_kv_decode.py``) run through an emulator of the instructions they use.
8-bit values go through the same word machinery (two codes a 16-bit word): their loop is bounded
too, against the byte-per-element loop it replaces.

Compiles: ``decode_kv`` is called on CPU tensors shaped as one decode step of Llama-3-8B heads
(32 query heads over 8 KV heads, head_dim 128, 16-slot pages, 32k tokens) with its launcher
patched to compile: Triton's own binder specialises the real arguments for an sm_90 target (a
stand-in driver answers for the GPU that is not there). tests/triton runs interpreted, so the
compiles happen in one child process without TRITON_INTERPRET (this file run as a script).

The interpreter runs Python semantics and cannot see what only the compiler does: whether the
4-bit words reach the dots' operand registers and are decoded there. For those formats, with the
PTX decodes, the token loop (the kernel's one loop) must hold no shared-memory table lookups and
store no decoded tile (bounds on its ``LDS``/``STS``), exchange between threads only for the
running max (``BAR``), and stay within a bound on its SASS instructions per tile; figures
measured on Triton 3.6 with some margin (the shared-memory pair tables these replace: 200 LDS,
57 STS, 25 BAR and 1038 instructions a tile for 4bit_nc).
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pytest
from ptx_emulator import lop3, prmt
from sm90_child import failure, require_triton, results

#: KV format -> (scheme name or None for bf16 pages, the word decoders: PTX (as the CUDA backend
#: passes them), portable, or none (4-bit codes through the shared-memory pair tables, 8-bit values
#: read byte by byte)); bf16 queries but for the one named fp32
FORMATS = {
    "bf16-pages": (None, None),
    "fp8": ("kv-fp8", "ptx"),
    "fp8-bytes": ("kv-fp8", None),
    "int8-token": ("kv-int8-token", "ptx"),
    "int8-g32": ("kv-int8-g32", "ptx"),
    "tq-k8v4": ("kv-tq-k8v4", "ptx"),
    "tq-4bit-nc": ("kv-tq-4bit-nc", "ptx"),
    "tq-4bit-nc-portable": ("kv-tq-4bit-nc", "portable"),
    "tq-4bit-nc-pairs": ("kv-tq-4bit-nc", None),
    "tq-4bit-nc-fp32": ("kv-tq-4bit-nc", "ptx"),
    "tq-k3v4-nc": ("kv-tq-k3v4-nc", "ptx"),
    "tq-3bit-nc": ("kv-tq-3bit-nc", "ptx"),
}
#: the token loop of the formats whose 4-bit codes go through the PTX word decodes: at most this
#: many (LDS incl. LDSM, STS, BAR, instructions); measured 34, 11, 13, 978 (4bit_nc), 96, 11, 13,
#: 799 (k8v4: fp8 keys), 110, 140, 17, 1106 (k3v4: 3-bit keys through pair tables)
WORD_LOOP_BOUNDS = {
    "tq-4bit-nc": (48, 16, 16, 1100),
    "tq-k8v4": (128, 16, 16, 900),
    "tq-k3v4-nc": (144, 170, 20, 1250),
}

#: the token loop of fp8 values read as byte-pair words (64-token tiles, the rule's): at most this
#: many (LDS incl. LDSM, instructions); measured 34, 430, where the same loop reading values byte
#: by byte ("fp8-bytes") takes 98 and 629
BYTE_LOOP_BOUNDS = {"fp8": (48, 480)}


# -- the child: compile instead of launch ---------------------------------------------------------


class _Sm90:
    """Triton's active driver, answering for an H100 that is not there."""

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: Any = None) -> int:
        return 0

    def get_current_target(self) -> Any:
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", 90, 32)


def _loop(sass: str) -> list[str]:
    """The instructions of the kernel's longest loop (a backward branch to an earlier label)."""
    lines = sass.splitlines()
    labels = {m.group(1): i for i, ln in enumerate(lines) if (m := re.match(r"^(\w+):\s*$", ln.strip()))}
    best: list[str] = []
    for i, ln in enumerate(lines):
        m = re.search(r"\bBRA\s+(\w+)\s*;", ln)
        if m and labels.get(m.group(1), i) < i:
            body = [x for x in lines[labels[m.group(1)] : i + 1] if x.strip().endswith(";")]
            best = max(best, body, key=len)
    return best


def _stats(kernel: Any) -> dict[str, Any]:
    ptx = kernel.asm["ptx"]
    out: dict[str, Any] = {
        "wgmma": "wgmma.mma_async" in ptx,
        "cp_async": bool(re.search(r"cp\.async\.c[ag]", ptx)),
        "prmt_asm": "lop3.b32 ha," in ptx,
    }
    loop = _loop(kernel.asm["sass"])
    ops = [re.sub(r"^@!?U?P\w+\s+", "", x.split("\t")[-1].strip()).split()[0] for x in loop]
    out.update(
        instructions=len(loop),
        lds=sum(o.startswith("LDS") for o in ops),
        sts=sum(o.startswith("STS") for o in ops),
        bar=sum(o.startswith("BAR") for o in ops),
        spills=sum(o.startswith(("STL", "LDL")) for o in ops),
    )
    return out


def _compile_all() -> dict[str, Any]:
    import torch
    from triton.runtime.driver import driver

    from quantrt.backends.cuda.policy import CUDA
    from quantrt.backends.cuda.triton_kv_decode import DECODERS
    from quantrt.backends.triton import kv
    from quantrt.backends.triton.kv_kernel import TritonKV
    from quantrt.kv.pages import KVPages
    from quantrt.schemes import parse_kv_scheme

    driver.set_active(_Sm90())
    kv.hw_fp8 = lambda device: True  # sm_90 converts e4m3 in hardware
    compiled: list[Any] = []
    kv._decode_launch = lambda grid, *a, **meta: compiled.append(
        kv._decode_kernel.run(*a, grid=grid, warmup=True, **meta)
    )
    combined: list[Any] = []
    kv._combine_launch = lambda grid, *a, **meta: combined.append(
        kv._combine_kernel.run(*a, grid=grid, warmup=True, **meta)
    )
    B, H, G, D, T = 1, 8, 4, 128, 32768
    out: dict[str, Any] = {}
    decoders = {None: None, "portable": kv.PORTABLE_DECODERS, "ptx": DECODERS}
    for name, (scheme_name, dec) in FORMATS.items():
        scheme = parse_kv_scheme(scheme_name) if scheme_name else None
        pages = KVPages(scheme, 4, 16, H, D, dtype=torch.bfloat16)
        try:
            kv.decode_kv(
                torch.zeros(B, H * G, D, dtype=torch.float32 if "fp32" in name else torch.bfloat16), scheme,
                pages.flat(), 16,
                torch.zeros(B, T // 16, dtype=torch.int32), torch.full((B,), T, dtype=torch.int32), T,
                scale=D**-0.5, k_scale=torch.ones(1), v_scale=torch.ones(1),
                tables=TritonKV(CUDA, "triton").tables(pages), decoders=decoders[dec],
            )  # fmt: skip
            out[name] = _stats(compiled.pop())
        except Exception as e:  # reported per format; the test names the failure
            out[name] = failure(e, out)
    out["grid-sync"] = _grid_sync_compile(kv, compiled, combined, (B, H, G, D, T))
    return out


def _grid_sync_compile(kv: Any, compiled: list, combined: list, shape: tuple) -> dict[str, Any]:
    """An fp8 decode with NVIDIA's grid sync: the decode signals, the combine waits and is
    compiled for a programmatic dependent launch."""
    import torch

    from quantrt.backends.cuda.triton_grid import GRID_SYNC
    from quantrt.kv.pages import KVPages
    from quantrt.schemes import parse_kv_scheme

    B, H, G, D, T = shape
    compiled.clear()
    combined.clear()
    scheme = parse_kv_scheme("kv-fp8")
    pages = KVPages(scheme, 4, 16, H, D, dtype=torch.bfloat16)
    try:
        kv.decode_kv(
            torch.zeros(B, H * G, D, dtype=torch.bfloat16), scheme, pages.flat(), 16,
            torch.zeros(B, T // 16, dtype=torch.int32), torch.full((B,), T, dtype=torch.int32), T,
            scale=D**-0.5, k_scale=torch.ones(1), v_scale=torch.ones(1), grid_sync=GRID_SYNC,
        )  # fmt: skip
    except Exception as e:  # reported; the test names the failure
        return {"error": f"{type(e).__name__}: {str(e)[:1500]}"}
    if not (compiled and combined):
        return {"error": "the decode and the combine were not both launched"}
    return {
        "signal": "griddepcontrol.launch_dependents" in compiled[-1].asm["ptx"],
        "wait": "griddepcontrol.wait" in combined[-1].asm["ptx"],
        "launch_pdl": bool(combined[-1].metadata.launch_pdl),
    }


@pytest.fixture(scope="module")
def compiled() -> dict:
    """Every format's loop figures (or its error), from one child process."""
    return results(__file__, timeout=600)


@pytest.mark.parametrize("name", list(FORMATS))
def test_decode_compiles_for_sm90(compiled: dict, name: str) -> None:
    got = compiled[name]
    assert "error" not in got, got.get("error")
    if name != "tq-3bit-nc":  # (3-bit values: 24-bit groups read a byte at a time)
        assert got["cp_async"], "the codes' loads are not pipelined"
    if name.endswith("fp32"):  # fp32 queries: IEEE dots on the FMA units (the compile is the check)
        return
    assert got["spills"] == 0, "registers spilled in the token loop"
    if FORMATS[name][0]:  # quantized: TurboQuant keys on the warp-group MMA, the others on mma.sync
        assert got["wgmma"] == name.startswith("tq"), got


@pytest.mark.parametrize("name", list(WORD_LOOP_BOUNDS))
def test_words_decode_in_registers(compiled: dict, name: str) -> None:
    got = compiled[name]
    assert "error" not in got, got.get("error")
    assert got["prmt_asm"] == (name == "tq-4bit-nc"), "the PTX decode of 4-bit keys"
    lds, sts, bar, n = WORD_LOOP_BOUNDS[name]
    figures = {k: got[k] for k in ("lds", "sts", "bar", "instructions")}
    assert got["lds"] <= lds and got["sts"] <= sts and got["bar"] <= bar, figures
    assert got["instructions"] <= n, figures


@pytest.mark.parametrize("name", list(BYTE_LOOP_BOUNDS))
def test_byte_words_reach_the_dot_through_wide_loads(compiled: dict, name: str) -> None:
    got = compiled[name]
    assert "error" not in got, got.get("error")
    lds, n = BYTE_LOOP_BOUNDS[name]
    figures = {k: got[k] for k in ("lds", "instructions")}
    assert got["lds"] <= lds and got["instructions"] <= n, figures
    assert compiled["fp8-bytes"]["lds"] > lds, "the byte-per-element loop is the one these replace"


def test_combine_launches_before_the_decode_ends(compiled: dict) -> None:
    """With NVIDIA's grid sync the decode signals at its start and the split combine, compiled
    for a programmatic dependent launch, waits for the decode grid before it reads the splits."""
    got = compiled["grid-sync"]
    assert "error" not in got, got.get("error")
    assert got["signal"] and got["wait"] and got["launch_pdl"], got


# -- the PTX decodes under an emulator of the instructions they use --------------------------------


def _half(h: int) -> float:
    return float(np.frombuffer(np.uint16(h).tobytes(), np.float16)[0])


def _bits(x: float) -> int:
    return int(np.frombuffer(np.float16(x).tobytes(), np.uint16)[0])


def run(asm: str, reg: int) -> int:
    """One block: $1 the input register, $0 the output."""
    regs: dict[str, int] = {"$1": reg}

    def val(tok: str) -> int:
        tok = tok.strip()
        return int(tok, 0) if tok[0].isdigit() else regs[tok]

    for ins in asm.replace("\n", " ").split(";"):
        ins = ins.strip().strip("{}").strip()
        if not ins or ins.startswith(".reg"):
            continue
        op, rest = ins.split(None, 1)
        if op == "mov.b32" and rest.startswith("{"):  # a register split into its 16-bit halves
            halves, src = rest.rsplit(",", 1)
            lo, hi = (x.strip(" {}") for x in halves.split(","))
            regs[lo], regs[hi] = val(src) & 0xFFFF, val(src) >> 16
            continue
        d, *a = (x.strip() for x in rest.split(","))
        v = [val(x) for x in a]
        if op == "mov.b32":
            r = v[0]
        elif op == "prmt.b32":
            r = prmt(*v)
        elif op == "lop3.b32":
            r = lop3(*v)
        elif op == "shr.b32":
            r = v[0] >> v[1]
        elif op == "shl.b32":
            r = v[0] << v[1]
        elif op == "and.b32":
            r = v[0] & v[1]
        elif op == "xor.b32":
            r = v[0] ^ v[1]
        elif op in ("cvt.rn.f16x2.e4m3x2", "cvt.rn.f16x2.e5m2x2"):  # low byte -> low half
            r = _fp8_to_half_bits(v[0] & 0xFF, op) | _fp8_to_half_bits(v[0] >> 8, op) << 16
        elif op == "mul.lo.u32":
            r = v[0] * v[1]
        elif op == "sub.rn.f16x2":
            r = sum(_bits(_half((v[0] >> s) & 0xFFFF) - _half((v[1] >> s) & 0xFFFF)) << s for s in (0, 16))
        else:
            raise AssertionError(f"the emulator lacks {op}")
        regs[d] = r & 0xFFFFFFFF
    return regs["$0"]


def _fp8_to_half_bits(byte: int, op: str) -> int:
    import torch

    f8 = torch.float8_e4m3fn if "e4m3" in op else torch.float8_e5m2
    return _bits(float(torch.tensor([byte], dtype=torch.uint8).view(f8).float()))


def _registers(seed: int) -> list[int]:
    """Random registers of two 16-bit code words, and every code in every position at least once."""
    rng = np.random.default_rng(seed)
    regs = [int(x) for x in rng.integers(0, 2**32, 200, dtype=np.uint64)]
    return regs + [sum(c << (4 * k) for k in range(8)) for c in range(16)]


@pytest.mark.parametrize("n", range(4))
def test_value_asm(n: int) -> None:
    from quantrt.backends.cuda.triton_kv_decode import value_asm

    for reg in _registers(n):
        got = run(value_asm(n), reg)
        want = [float((reg >> (16 * h + 4 * n)) & 15) for h in (0, 1)]
        assert [_half(got & 0xFFFF), _half(got >> 16)] == want, hex(reg)


@pytest.mark.parametrize("kind", [1, 2])  # e4m3, e5m2 (backends/triton/kv.py's KIND)
@pytest.mark.parametrize("n", range(2))
def test_byte_asm(kind: int, n: int) -> None:
    """Byte n of both 16-bit words of a register, as two fp16: the value the stored code means
    (as torch converts it, NaN for NaN), every byte in both places."""
    import torch

    from quantrt.backends.cuda.triton_kv_decode import byte_asm

    rng = np.random.default_rng(20 + 2 * kind + n)
    regs = [int(x) for x in rng.integers(0, 2**32, 200, dtype=np.uint64)]
    regs += [sum(c << (8 * k) for k in range(4)) for c in range(256)]
    f8 = {1: torch.float8_e4m3fn, 2: torch.float8_e5m2}[kind]
    for reg in regs:
        got = run(byte_asm(kind, n), reg)
        codes = [(reg >> (16 * h + 8 * n)) & 0xFF for h in (0, 1)]
        want = [float(torch.tensor([c], dtype=torch.uint8).view(f8).float()) for c in codes]
        have = [_half(got & 0xFFFF), _half(got >> 16)]
        assert all((a == b) or (a != a and b != b) for a, b in zip(have, want, strict=True)), hex(reg)


def _books() -> dict[str, tuple[int, ...]]:
    import torch

    from quantrt.reference.turboquant import codebook

    c, _ = codebook(128, 4)
    rng = np.random.default_rng(5)
    lopsided = np.sort(rng.normal(0, 0.1, 16)).astype(np.float16)
    return {
        "symmetric": tuple(int(b) & 0xFFFF for b in c.to(torch.float16).view(torch.int16).tolist()),
        "any": tuple(_bits(float(x)) for x in lopsided),
    }


@pytest.mark.parametrize("book", ["symmetric", "any"])
@pytest.mark.parametrize("n", range(4))
def test_key_asm(book: str, n: int) -> None:
    from quantrt.backends.cuda.triton_kv_decode import key_asm, symmetric

    bits = _books()[book]
    assert symmetric(bits) == (book == "symmetric")
    for reg in _registers(10 + n):
        got = run(key_asm(bits, n), reg)
        want = [bits[(reg >> (16 * h + 4 * n)) & 15] for h in (0, 1)]
        assert [got & 0xFFFF, got >> 16] == want, hex(reg)


if __name__ == "__main__":
    require_triton()
    print(json.dumps(_compile_all()))
