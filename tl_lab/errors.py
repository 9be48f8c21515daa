"""The errors every refusal raises (interface page, "Errors").

Each refusal names the offending field, tensor, id or value, and leaves state as it was.
"""


MAX_MESSAGE = 1000  # characters in a refusal's message: a tensor name of 95 MB is shown by its two ends


def clip(text: str, limit: int = MAX_MESSAGE) -> str:
    """`text`, or its first and last limit/2 characters around a count of what was left out."""
    if len(text) <= limit:
        return text
    keep = limit // 2
    return f"{text[:keep]} ...[{len(text) - 2 * keep:,} characters left out]... {text[-keep:]}"


class TlError(Exception):
    """Base of every tl_lab refusal. Its message is clipped to MAX_MESSAGE characters: it names
    what a user gave (a tensor name, a shape), which can be as long as a file."""

    def __init__(self, *args) -> None:
        super().__init__(*(clip(a) if isinstance(a, str) else a for a in args))


class FormatError(TlError):
    """A malformed safetensors file or kv-block envelope."""


class ConfigError(TlError):
    """A config.json the engine cannot run correctly."""


class KvError(TlError):
    """A misuse of the KV pool: bad dimensions, exhausted capacity, a bad block id or state."""


class BatchError(TlError):
    """A ForwardBatch the runner refuses before writing anything."""
