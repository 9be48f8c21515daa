"""The errors every refusal raises (interface page, "Errors").

Each refusal names the offending field, tensor, id or value, and leaves state as it was.
"""


class TlError(Exception):
    """Base of every tl_lab refusal."""


class FormatError(TlError):
    """A malformed safetensors file or kv-block envelope."""


class ConfigError(TlError):
    """A config.json the engine cannot run correctly."""


class KvError(TlError):
    """A misuse of the KV pool: bad dimensions, exhausted capacity, a bad block id or state."""


class BatchError(TlError):
    """A ForwardBatch the runner refuses before writing anything."""
