"""A refusal checked by its type and the fields it names, not its sentence (issue 60).

The sentence of an error message is the learner's to write; what a lab test may hold them to is the
error's type and what it names: the argument or field (`KvCfg.n_blocks`, `is_v`, `alloc(4)`), the
values (`3`, `u64`, `q[0, 1] = 8`). `fields(text, module)` are the tokens of a message that are names
of the module (its identifiers: tools/reword_messages.py's rule), or hold a digit, `_`, `.` or a call's
parentheses; `raises_naming(exc, text)` is `pytest.raises(exc)` plus each of those in the message.
A complete learner module with its own wording (tools/reword_messages.py) passes what this checks.
"""

from __future__ import annotations

import ast
import re
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import pytest

_TOKEN = re.compile(r"[A-Za-z_][\w.]*(?:\([^()]*\))?|-?\d[\w.]*")


@cache
def identifiers(module: str) -> frozenset:
    import importlib.util

    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("reword_messages", root / "tools" / "reword_messages.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return frozenset(m.identifiers(ast.parse((root / "tl_lab" / f"{module}.py").read_text(encoding="utf-8"))))


def unregex(pattern: str) -> str:
    """A `match=` pattern as the text it matches: anchors dropped, `.*` a space, escapes undone."""
    text = pattern.replace(".*", " ").strip("^$")
    return re.sub(r"\\(.)", r"\1", text)


def fields(text: str, module: str = "kv") -> list[str]:
    keep = identifiers(module)
    out = []
    for t in _TOKEN.findall(text):
        t = t.rstrip(".")
        if t and (any(c.isdigit() or c in "_.(" for c in t) or any(p in keep for p in t.split("."))):
            out.append(t)
    return out


def names_all(message: str, text: str, module: str = "kv") -> list[str]:
    """The fields of `text` missing from `message` ([] when it names them all)."""
    return [t for t in fields(text, module) if t not in message]


@contextmanager
def raises_naming(exc, pattern: str, module: str = "kv"):
    """pytest.raises(exc), and its message names every field of `pattern` (a match= regex)."""
    with pytest.raises(exc) as info:
        yield info
    missing = names_all(str(info.value), unregex(pattern), module)
    assert not missing, f"{exc.__name__} raised, but its message does not name {missing}: {info.value}"
