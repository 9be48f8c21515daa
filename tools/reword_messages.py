"""A complete learner module with its own wording: the reference with every raise's message reworded.

Issue 60 ("graded tests grade what the learner is responsible for"): a learner's module that passes
`exercise check` should pass its module's lab tests too, except for the sentences of its error messages,
which are the learner's to write (unless the stub states them). This tool writes such a module: the
reference's source with each `raise X("...")` / `raise X(f"...")` message reworded. The words a learner
must keep stay as they are: every word that is an identifier of the module (a name, an attribute, an
argument, a field: `temperature`, `KvCfg.n_blocks`, `top_k`) and every number; the other words (the
sentence: "must be", "at least", "not") are written in capitals, so a test that pins the sentence fails
and a test that checks the type and the field named passes.

    python tools/reword_messages.py OUT_DIR [MODULE ...]     # default: the six
    then: TL_LAB_WORKSPACE=OUT_DIR pytest tests/test_quant.py tests/test_quant_boundaries.py

`reword(source) -> source` is the function (tests/test_reword_messages.py).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

MODULES = ("kv", "quant", "model", "forward", "runner", "sample")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")


def identifiers(tree: ast.AST) -> set[str]:
    """The names, attributes, arguments and keywords of the module, and the dotted parts of each."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
        elif isinstance(node, ast.keyword) and node.arg:
            out.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            out.add(node.name)
        elif isinstance(node, ast.alias):
            out.add((node.asname or node.name).split(".")[-1])
    return out


def _reword_text(text: str, keep: set[str]) -> str:
    def one(m: re.Match) -> str:
        w = m.group(0)
        parts = w.strip(".").split(".")
        if any(p in keep for p in parts) or not w.isalpha() or not w.islower():
            return w  # an identifier, a dotted name, a word with a digit, a capitalised name: the learner keeps it
        return w.upper()

    return _WORD.sub(one, text)


def reword(source: str) -> str:
    """`source` with each raise's message (a str or f-string first argument) reworded (see the module)."""
    tree = ast.parse(source)
    keep = identifiers(tree)

    class T(ast.NodeTransformer):
        def visit_Raise(self, node: ast.Raise) -> ast.Raise:
            call = node.exc
            if isinstance(call, ast.Call) and call.args:
                msg = call.args[0]
                if isinstance(msg, ast.Constant) and isinstance(msg.value, str):
                    msg.value = _reword_text(msg.value, keep)
                elif isinstance(msg, ast.JoinedStr):
                    for v in msg.values:
                        if isinstance(v, ast.Constant) and isinstance(v.value, str):
                            v.value = _reword_text(v.value, keep)
            return node

    return ast.unparse(T().visit(tree)) + "\n"


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    root = Path(__file__).resolve().parent.parent
    for m in argv[1:] or MODULES:
        (out / f"{m}.py").write_text(reword((root / "tl_lab" / f"{m}.py").read_text(encoding="utf-8")), encoding="utf-8")
        print(out / f"{m}.py")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
