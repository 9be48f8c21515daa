"""tools/boundary_mutation.py: which mutants it makes, and that each applies to its own text only."""

from conftest import tool

SRC = '''"""x < 1 in a docstring is never mutated."""
def f(n, table, B):
    if n <= len(table) - 1:  # a comment: x > 2
        return min(n, 64) + max(0, B // 2)
    s = "a >= 3"
    return as_int(n, "n", lo=1, hi=7) > B
'''


def test_every_comparison_and_off_by_one_and_nothing_in_strings_or_comments():
    bm = tool("boundary_mutation")
    got = [(m.line, m.old, m.new) for m in bm.mutants(SRC)]
    assert got == [
        (3, "<=", "<"), (3, "1", "0"), (3, "1", "2"),
        (4, "64", "63"), (4, "64", "65"), (4, "0", "1"), (4, "2", "1"), (4, "2", "3"),
        (6, "1", "0"), (6, "1", "2"), (6, "7", "6"), (6, "7", "8"), (6, ">", ">="),
    ]
    for m in bm.mutants(SRC):
        out = bm.apply(SRC, m)
        assert out != SRC and len(out.splitlines()) == len(SRC.splitlines())
        assert [a for a, b in zip(SRC.splitlines(), out.splitlines()) if a != b] == [SRC.splitlines()[m.line - 1]]


def test_every_module_has_its_mirror_and_boundary_tests():
    from pathlib import Path

    bm = tool("boundary_mutation")
    root = Path(__file__).resolve().parent.parent
    for module, (mirror, extra) in bm.MODULES.items():
        assert (root / bm.source_of(module)).is_file()
        assert all((root / f).is_file() for f in mirror + extra), module
