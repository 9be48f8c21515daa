"""The stubs: the reference's own source with each learner body replaced by `raise NotImplementedError`.

Chapter L10.1, "How to work this chapter" (`ol start`). A stub keeps every line of the reference
but the bodies of the pieces `tl_lab.lab.exercise.registry.PIECES` names: the imports of the given
modules, the signatures, types, docstrings (what to do, which errors to raise, the section), the
constants and the given helpers. Each learner body becomes one line raising NotImplementedError
with the piece's section and hint. Done on the source text with the ast's line and column ranges,
so comments and docstrings survive exactly; a copy of the reference module is a complete solution.
"""

from __future__ import annotations

import ast
import re
import threading
from pathlib import Path

from tl_lab.errors import TlError
from tl_lab.lab.exercise.registry import MODULES, PIECES, SECTIONS, Piece, pieces

__all__ = ["ExerciseError", "reference_path", "reference_source", "stub_source", "learner_lines", "NOT_WRITTEN"]

PACKAGE_DIR = Path(__file__).resolve().parents[2]  # tl_lab/, this file being tl_lab/lab/exercise/stubs.py
NOT_WRITTEN = "not written yet"  # every stub's NotImplementedError message starts with the piece's name, then this


class ExerciseError(TlError):
    """A bad exercise request: an unknown module, a piece the reference does not have, a workspace
    that cannot be used."""



_AST_LOCK = threading.Lock()  # CPython 3.11's ast.parse is not safe in two threads at once ("AST constructor recursion depth mismatch")


def _parse(source: str) -> ast.Module:
    with _AST_LOCK:
        return ast.parse(source)

def check_module(module: str) -> str:
    if module not in MODULES:
        raise ExerciseError(f"unknown module {module!r}: the learner's modules are {', '.join(MODULES)}")
    return module


def reference_path(module: str) -> Path:
    return PACKAGE_DIR / f"{check_module(module)}.py"


def reference_source(module: str) -> str:
    return reference_path(module).read_text(encoding="utf-8")


def _node(tree: ast.Module, qualname: str) -> ast.FunctionDef:
    body, node = tree.body, None
    for name in qualname.split("."):
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == name), None)
        if node is None:
            break
        body = node.body
    if not isinstance(node, ast.FunctionDef):
        raise ExerciseError(f"tl_lab.lab.exercise.registry names {qualname!r}, which tl_lab's reference does not "
                            f"define as a function: update the registry")
    return node


def _body_span(fn: ast.FunctionDef) -> tuple[ast.stmt, ast.stmt]:
    """The first and last statements of fn's body after its docstring."""
    body = fn.body
    has_doc = isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)
    if has_doc and len(body) == 1:
        raise ExerciseError(f"{fn.name} has only a docstring: nothing to blank")
    return (body[1] if has_doc else body[0]), body[-1]


def _message(piece: Piece) -> str:
    return f"{piece.qualname}: {NOT_WRITTEN} (section {piece.section}: {piece.hint})"


def _offset(lines: list[str], lineno: int, col: int) -> int:
    """Character offset of (lineno 1-based, col in utf-8 bytes) in the joined lines."""
    line = lines[lineno - 1]
    return sum(len(s) for s in lines[: lineno - 1]) + len(line.encode("utf-8")[:col].decode("utf-8"))


def blank(source: str, module: str, qualnames=None) -> str:
    """`source` with the bodies of the pieces of `module` (or only `qualnames`) replaced by one
    `raise NotImplementedError(...)` each, at the body's indentation."""
    tree = _parse(source)
    lines = source.splitlines(keepends=True)
    edits = []
    for piece in pieces(module):
        if qualnames is not None and piece.qualname not in qualnames:
            continue
        fn = _node(tree, piece.qualname)
        first, last = _body_span(fn)
        a = _offset(lines, first.lineno, first.col_offset)
        b = _offset(lines, last.end_lineno, last.end_col_offset)
        edits.append((a, b, f"raise NotImplementedError({_message(piece)!r})"))
    for a, b, text in sorted(edits, reverse=True):
        source = source[:a] + text + source[b:]
    return source


def _header(module: str) -> str:
    return (f"# Your tl_lab/{module}.py of chapter L10.1: write each body that raises NotImplementedError.\n"
            f"# Read {SECTIONS[module]}. The rest is given: keep it.\n"
            f"# Check it with: python -m tl_lab exercise check {module}\n")


def stub_source(module: str) -> str:
    """The stub of `module`: the reference with every learner body blanked, under a three-line header."""
    return _header(module) + blank(reference_source(module), check_module(module))


def learner_lines(module: str) -> dict[str, int]:
    """Lines of the reference the learner writes, per piece: its body without the docstring."""
    tree = _parse(reference_source(module))
    out = {}
    for piece in pieces(module):
        first, last = _body_span(_node(tree, piece.qualname))
        out[piece.qualname] = last.end_lineno - first.lineno + 1
    return out


def written(ws: Path, module: str) -> dict[str, bool]:
    """Each piece of `module`: True when the learner's file no longer has the stub's raise in it."""
    from tl_lab.lab.exercise.files import SOURCE_LIMIT, read_regular

    f = ws / f"{module}.py"
    try:  # bounded (issue #61: a 100 MB kv.py was read and parsed whole, 26-38 s): past the limit, none written
        text = read_regular(f, SOURCE_LIMIT).decode("utf-8", errors="replace") if f.is_file() else ""
    except OSError:
        text = ""
    return {p.qualname: not _stub_raise(p.qualname).search(text) and bool(text) for p in PIECES[module]}


def _stub_raise(qualname: str) -> re.Pattern:
    """The stub's message of piece `qualname`, not inside another piece's: "f16_to_f32: not written yet"
    is also the tail of bf16_to_f32's and "f32_to_f16: ..." of explain_f32_to_f16's."""
    return re.compile(r"(?<![\w.])" + re.escape(f"{qualname}: {NOT_WRITTEN}"))
