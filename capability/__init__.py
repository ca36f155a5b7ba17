"""Hardware capability probe. Imports nothing from the rest of quantrt."""

from .presets import load_capabilities, load_preset, preset_names
from .probe import ProbeSources, probe
from .types import Capabilities, CapabilityError, DeviceCaps

__all__ = [
    "Capabilities",
    "CapabilityError",
    "DeviceCaps",
    "ProbeSources",
    "load_capabilities",
    "load_preset",
    "preset_names",
    "probe",
]
