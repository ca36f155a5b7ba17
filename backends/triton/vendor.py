"""What a vendor folder tells the portable Triton kernels: the devices they run on, the tile tables
per architecture, the fp8 flavour, and whether the vendor's BLAS takes large fp8 batches.

Triton compiles this folder's kernels for NVIDIA, AMD and Intel GPUs alike; what differs between
vendors is policy. Each vendor folder (``backends/cuda``, ``rocm``, ``xpu``) makes one
:class:`VendorPolicy` and :func:`specialise` s this folder's Kernel classes with it. The kernels ask
the policy (never ``torch.cuda`` or another folder), as Triton's own ``third_party/<vendor>/backend``
answer for their hardware behind one interface.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import torch

from quantrt.kernels import Kernel, Verdict

from . import tile_table

Condition = tuple[bool, str, dict[str, Any]]


@dataclass(frozen=True)
class Target:
    """One device as a kernel's ``prepare`` sees it."""

    arch: str  # the tile tables' key (sm_90, gfx942, pvc; "default" off the GPU)
    fp8: torch.dtype = torch.float8_e4m3fn  # the e4m3 flavour fp8 W8A8 codes are multiplied in
    warp_size: int = 32  # lanes per warp (a wavefront of 64 on AMD CDNA)
    scaled_mm: bool = False  # torch._scaled_mm (the vendor's BLAS) may take large fp8 W8A8 batches

    @property
    def fnuz(self) -> bool:
        """e4m3fnuz (MI300): the scheme's e4m3 grid at half the value, so scales are doubled."""
        return self.fp8 == torch.float8_e4m3fnuz


class VendorPolicy(ABC):
    """A vendor's answers for the portable kernels. ``pin``: one target for every device (tests
    run a vendor's tables and fp8 flavour through the CPU interpreter so)."""

    vendor: ClassVar[str]  # the kernels' name prefix: "cuda", "rocm", "xpu"
    package: ClassVar[str]  # the folder whose tunings/ hold the tile tables
    #: off the GPU (the CPU interpreter's tests): the folder's default tables, OCP fp8
    offline: ClassVar[Target] = Target("default")

    def __init__(self, pin: Target | None = None) -> None:
        self.pin = pin

    @abstractmethod
    def device_conditions(self, caps: Any) -> list[Condition]:
        """What every Triton kernel needs of the device (matrix units, Triton itself)."""

    @abstractmethod
    def fp8_units(self, caps: Any) -> Condition:
        """Whether the device multiplies fp8 (W8A8 fp8 natively, in either e4m3 flavour)."""

    @abstractmethod
    def device_target(self, device: torch.device) -> Target:
        """The target of a GPU of this vendor."""

    @abstractmethod
    def runs_on(self, device: torch.device) -> Verdict:
        """Whether ``device`` (of this process's torch) is one of this vendor's GPUs the kernels
        run on: for kernels chosen per tensor, not planned from capabilities (the KV cache)."""

    def target(self, device: torch.device) -> Target:
        """The pinned target, the GPU's, or :attr:`offline` for a CPU tensor (the interpreter)."""
        if self.pin is not None:
            return self.pin
        return self.offline if device.type == "cpu" else self.device_target(device)

    def kv_decoders(self) -> tuple[Any, ...] | None:
        """The vendor's (key, value) 4-bit decoders for the KV decode kernel (jit functions,
        ``backends/triton/kv.py``'s word path), or None for the portable pair tables."""
        return None

    def kv_grid_sync(self, device: torch.device) -> tuple[Any, Any] | None:
        """The vendor's (signal, wait) jit functions that let the KV decode's split combine launch
        before the decode grid ends (``decode_kv(grid_sync=...)``), or None: launched after it."""
        return None

    def table(self, name: str, target: Target) -> dict[str, Any]:
        """The tile table ``name`` for the target's architecture (the folder's default otherwise)."""
        return tile_table.load(self.package, name, target.arch)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(pin={self.pin!r})"


class TritonKernel(Kernel):
    """A Kernel class over this folder's Triton kernels, vendor-neutral until :func:`specialise`
    names it and gives it its vendor's policy."""

    short_name: ClassVar[str]  # the name after the vendor prefix ("triton_w4a16")
    policy: ClassVar[VendorPolicy]


K = TypeVar("K", bound=type[TritonKernel])


def specialise(policy: VendorPolicy, *bases: K) -> tuple[K, ...]:
    """One registrable subclass per base for this vendor, named ``<vendor>.<short_name>`` (the
    registry stamps each class with one backend, so every vendor gets classes of its own)."""
    prefix = policy.vendor.capitalize()
    return tuple(
        type(base)(
            prefix + base.__name__,
            (base,),
            {
                "name": f"{policy.vendor}.{base.short_name}",
                "policy": policy,
                "__doc__": base.__doc__,
                "__module__": base.__module__,
            },
        )
        for base in bases
    )
