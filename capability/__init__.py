"""Hardware capability probe. Imports nothing from the rest of quantrt."""

from .kinds import DeviceKind, kind_of, kinds, reset_kinds
from .presets import load_capabilities, load_preset, preset_names
from .probe import ProbeSources, probe, reset_probe
from .types import Capabilities, CapabilityError, DeviceCaps

__all__ = [
    "Capabilities",
    "CapabilityError",
    "DeviceCaps",
    "DeviceKind",
    "ProbeSources",
    "kind_of",
    "kinds",
    "load_capabilities",
    "load_preset",
    "preset_names",
    "probe",
    "reset_kinds",
    "reset_probe",
]
