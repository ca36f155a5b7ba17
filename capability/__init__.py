"""Hardware capability probe. Imports nothing from the rest of quantrt."""

from .types import Capabilities, CapabilityError, DeviceCaps

__all__ = ["Capabilities", "CapabilityError", "DeviceCaps"]
