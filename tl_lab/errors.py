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


# Every character str.splitlines() breaks a line at, as its escape: a message quotes what a user or a
# file gave (a chat template's raise_exception('a\nb'), a path), and "one line" is the command line's
# contract (was: two lines, the second free to start with "error: ").
_LINE_BREAKS = {c: repr(chr(c))[1:-1] for c in (0x0A, 0x0B, 0x0C, 0x0D, 0x1C, 0x1D, 0x1E, 0x85, 0x2028, 0x2029)}


def one_line(text: str) -> str:
    """`text` with each line break written as its escape (\\n, \\r, \\u2028, ...)."""
    return text.translate(_LINE_BREAKS)


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
