"""The errors quantrt raises. Each names the thing at fault and the expected vs found value."""

from __future__ import annotations


class QuantrtError(Exception):
    """Base class of every error quantrt raises on purpose."""


class ShardError(QuantrtError, ValueError):
    """A tensor cannot be cut for tensor parallelism, or a loaded tensor has the wrong shape."""


class DispatchError(QuantrtError, RuntimeError):
    """No kernel could be chosen, or a chosen/forced kernel cannot run the layer here."""


class ConfigError(QuantrtError, ValueError):
    """A QUANTRT_* environment variable or an option has a value quantrt cannot use."""


class ReferenceInputError(QuantrtError, ValueError):
    """Input a reference quantizer or dequantizer cannot use: a shape, dtype, missing tensor,
    non-finite value or group that does not fit; the message names it, expected vs found."""


class CheckpointError(QuantrtError, ValueError):
    """A checkpoint quantrt cannot read as it claims to be: the message names the file, the
    tensor or config key, and the expected vs found value."""
