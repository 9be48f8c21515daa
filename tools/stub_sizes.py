"""How much of each stub is given code and how much the learner writes (issue: the stubs' given code).

    python tools/stub_sizes.py [--json]

Counts code lines (not blank, comment or docstring) of each module's stub outside the blanked bodies
(given) and of the reference's piece bodies (learner's). Docstrings of pieces count as neither.
"""

from __future__ import annotations

import ast
import io
import json
import sys
import tokenize

from tl_lab.lab.exercise import stubs
from tl_lab.lab.exercise.registry import MODULES


def code_lines(source: str) -> set[int]:
    """Line numbers holding code: tokens other than comments, newlines and docstrings."""
    doc_lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                doc_lines.update(range(first.lineno, first.end_lineno + 1))
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            doc_lines.update(range(node.lineno, node.end_lineno + 1))  # attribute docstrings
    lines: set[int] = set()
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING,
            tokenize.ENDMARKER}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in skip:
            lines.update(range(tok.start[0], tok.end[0] + 1))
    return lines - doc_lines


def sizes(module: str) -> dict[str, int]:
    stub = stubs.stub_source(module)
    blanked = {i for i, line in enumerate(stub.splitlines(), 1) if "raise NotImplementedError(" in line
               and stubs.NOT_WRITTEN in line}
    given = len(code_lines(stub) - blanked)
    ref = stubs.reference_source(module)
    learner = sum(stubs.learner_lines(module).values())
    return {"module": module, "given": given, "learner": learner, "reference": len(code_lines(ref))}


def main() -> None:
    rows = [sizes(m) for m in MODULES]
    if "--json" in sys.argv[1:]:
        print(json.dumps(rows, indent=1))
        return
    for r in rows:
        print(f"{r['module']:8} given {r['given']:4}  learner {r['learner']:4}")
    print(f"{'total':8} given {sum(r['given'] for r in rows):4}  learner {sum(r['learner'] for r in rows):4}")


if __name__ == "__main__":
    main()
