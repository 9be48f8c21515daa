"""The layout is the chapter's section 2.1 diagram, and imports point one way (docs/dev/conventions.md).

    lab (pitfalls, switch, compare, exercise, widgets)     beside: may import anything below
    engine (blocks, generate, tokenizer, fetch)            uses the runner
    runner > forward > model > quant, kv; sample           the six learner modules
    ops (what plays candle-core and candle-nn)             imports no learner module
    errors                                                 imports nothing of tl_lab

Every import statement counts, at module level or inside a function (a lazy import is still an
arrow). `tl_lab/__init__.py` and `tl_lab/__main__.py` are the package's doors: the first switches a
workspace or a pitfall on before any learner module is imported, the second is the command line;
both may reach any layer and nothing imports them. The graph also has no circles.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tl_lab.ops.paths import PACKAGE_DIR

LEARNER = ("kv", "quant", "model", "forward", "runner", "sample")
# which learner modules each learner module may import: the chapter's layers (runner on forward on
# model on quant; kv beside the forward, which writes it; sample alone)
LEARNER_MAY = {
    "quant": set(),
    "kv": set(),
    "sample": set(),
    "model": {"quant"},
    "forward": {"quant", "kv", "model"},
    "runner": {"quant", "kv", "model", "forward"},
}
DOORS = {"tl_lab", "tl_lab.__main__"}


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE_DIR.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE_DIR.rglob("*.py"))}


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """The tl_lab modules `path` imports anywhere in it (`from tl_lab.x import y` is tl_lab.x.y when
    that is a module, else tl_lab.x)."""
    out: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known and "." in t:
                t = t.rpartition(".")[0]
            if t in known and t != name:
                out.add(t)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(path, name, known) for name, path in mods.items()}


def layer(name: str) -> str:
    parts = name.split(".")
    if name in DOORS:
        return "door"
    if len(parts) == 2 and parts[1] in LEARNER:
        return "learner"
    if name == "tl_lab.errors":
        return "errors"
    return parts[1]  # ops, engine, lab


ALLOWED = {
    "errors": set(),
    "ops": {"ops", "errors"},
    "learner": {"learner", "ops", "errors"},
    "engine": {"engine", "learner", "ops", "errors"},
    "lab": {"lab", "engine", "learner", "ops", "errors"},
    "door": {"lab", "engine", "learner", "ops", "errors", "door"},
}


def test_the_top_level_is_the_chapter():
    """`ls tl_lab` shows the six learner modules, the package's doors and errors, and three folders."""
    top = sorted(p.name for p in PACKAGE_DIR.iterdir() if not p.name.startswith(("__pycache__", ".")) and p.name != "_data"
                 and p.name != "_formats")
    assert top == sorted([f"{m}.py" for m in LEARNER] + ["__init__.py", "__main__.py", "errors.py", "ops", "engine", "lab"]), top


@pytest.mark.parametrize("layer_name", sorted(ALLOWED))
def test_imports_point_one_way(layer_name):
    g = graph()
    wrong = [f"{a} imports {b}" for a, bs in g.items() if layer(a) == layer_name for b in sorted(bs)
             if layer(b) not in ALLOWED[layer_name] or b in DOORS]
    assert not wrong, "\n".join(wrong)


def test_learner_modules_follow_the_chapters_layers():
    g = graph()
    wrong = [f"{a} imports {b}" for a, bs in g.items() if layer(a) == "learner" for b in sorted(bs)
             if layer(b) == "learner" and b.split(".")[1] not in LEARNER_MAY[a.split(".")[1]]]
    assert not wrong, "\n".join(wrong)


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    assert cycles(graph()) == []


def test_the_cycle_finder_finds_a_circle():
    """So the test above could fail: a two-module and a three-module circle, and a chain that is none."""
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": {"a"}}) == [["a", "b"], ["c", "d", "e"]]
    assert cycles({"a": {"b"}, "b": {"c"}}) == []


def test_the_layer_check_sees_a_wrong_arrow(tmp_path):
    """An ops module importing a learner module, found by the same parser the tests above use."""
    pkg = tmp_path / "tl_lab"
    (pkg / "ops").mkdir(parents=True)
    (pkg / "ops" / "bad.py").write_text("def f():\n    from tl_lab.kv import KvPool\n")
    known = {"tl_lab.kv", "tl_lab.ops.bad", "tl_lab.ops"}
    assert imports_of(pkg / "ops" / "bad.py", "tl_lab.ops.bad", known) == {"tl_lab.kv"}
    assert layer("tl_lab.kv") not in ALLOWED[layer("tl_lab.ops.bad")]
