"""The hints and the stubs' docstrings cannot drift from the code and the specs.

A hint's formula (`Piece.formula`, word for word in the hint) is evaluated here against the reference on
a few values; every helper a hint or a piece's docstring names in backticks is a name that exists, and a
hint's helper is one the module really imports or defines; the wording is the Python learner's (kv.py,
the pool's own state), never the chapter's Rust file names.
"""

import ast
import importlib
import re

import numpy as np
import pytest

from tl_lab.lab.exercise.registry import MODULES, PIECES, SECTIONS
from tl_lab.lab.exercise.stubs import reference_source

ALL = [p for m in MODULES for p in PIECES[m]]
WITH_FORMULA = [p for p in ALL if p.formula]


def ref(module):
    return importlib.import_module(f"tl_lab.{module}")


def formula(piece, **names):
    """The piece's formula evaluated with the reference module's names and `names`."""
    return eval(piece.formula, {**vars(np), **vars(ref(piece.module)), "np": np, **names})  # noqa: S307


def _uniform(p, s):
    for seed, seq in ((42, 54), (0, 4), (2**64 - 1, 7)):
        g, h = s.Pcg32(seed, seq), s.Pcg32(seed, seq)
        for _ in range(5):
            a, b = h.next_u32(), h.next_u32()
            assert formula(p, a=a, b=b) == g.uniform_f64()


def _child(p, s):
    for seed, purpose in ((0, 4), (42, 4), (2**64 - 1, 2**64 - 1), (123456789, 0)):
        assert formula(p, seed=seed, purpose=purpose) == s.child_seed(seed, purpose)
    assert formula(p, seed=0, purpose=4) == 0xF88BB8A8724C81EC  # the spec's table, docs/spec/pcg32.md


def _stream(p, s):
    for seed, purpose in ((0, 4), (7, 3)):
        a, b = formula(p, seed=seed, purpose=purpose), s.stream(seed, purpose)
        assert [a.next_u32() for _ in range(4)] == [b.next_u32() for _ in range(4)]


def _bf16_scalar(p, q):
    for h in (0, 0x3F80, 0x8000, 0x7F80, 0xFF80, 0x0001, 0x7F7F):
        assert formula(p, h=h) == int(np.float32(q.bf16_to_f32_scalar(h)).view(np.uint32))


def _unpack(p, q):
    for v in range(16):
        packed = q.pack_int4(np.array([formula(p, v=v), 0]), 1, 2)
        assert int(q.unpack_int4(packed)[0, 0]) == formula(p, v=v)
        assert int(q.unpack_int4(bytes([v]))[0]) == formula(p, v=v)


def _bf16(p, q):
    x = np.array([1.0, 1.00390625, 1.01171875, -3.3e38, 3.4e38, 1e-40, 0.1], np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    assert np.array_equal(formula(p, u=u).astype(np.uint16), q.f32_to_bf16(x))


def _scales(p, q):
    rng = np.random.default_rng(0)
    Wg = rng.standard_normal((3, 2, 8)).astype(np.float32)
    assert np.array_equal(formula(p, Wg=Wg), q._group_scales(Wg))


def _inv_freq(p, f):
    for D, theta in ((8, 10000.0), (64, 500000.0), (2, 1.0)):
        assert np.array_equal(formula(p, D=D, theta=theta), f.rope_inv_freq(D, theta))


def _location(p, f):
    table, B = np.array([5, 2, 9]), 4
    j = np.arange(12)
    assert np.array_equal(formula(p, table=table, j=j, B=B), f.kv_location(table, j, B)[0])


EVALUATED = {"Pcg32.uniform_f64": _uniform, "child_seed": _child, "stream": _stream, "bf16_to_f32_scalar": _bf16_scalar,
             "unpack_int4": _unpack, "f32_to_bf16": _bf16, "_group_scales": _scales, "rope_inv_freq": _inv_freq,
             "kv_location": _location}


@pytest.mark.parametrize("piece", WITH_FORMULA, ids=lambda p: f"{p.module}.{p.qualname}")
def test_a_hints_formula_is_the_references(piece):
    assert f"`{piece.formula}`" in piece.hint
    EVALUATED[piece.qualname](piece, ref(piece.module))


def test_every_formula_is_evaluated():
    assert {p.qualname for p in WITH_FORMULA} == set(EVALUATED)


def test_the_child_seed_hint_is_the_specs():
    """Issue 60: the hint said mix64(seed + GOLDEN_GAMMA * (purpose + 1)); the spec says seed + purpose * GOLDEN_GAMMA."""
    p = next(p for p in PIECES["sample"] if p.qualname == "child_seed")
    assert "purpose + 1" not in p.hint and "seed + purpose * GOLDEN_GAMMA" in p.hint
    from tl_lab.ops.paths import REPO_ROOT

    assert "mix64(seed + purpose * 0x9E3779B97F4A7C15)" in (REPO_ROOT / "docs/spec/pcg32.md").read_text()


_NAME = re.compile(r"`([A-Za-z_][\w.]*)(\([^`]*\))?`")


def _resolve(module, dotted: str):
    """The object `dotted` names from inside `module` (its namespace, a class of it, or a tl_lab path), or
    raise LookupError."""
    parts = dotted.split(".")
    if parts[0] == "tl_lab":
        for i in range(len(parts), 1, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            for a in parts[i:]:
                obj = getattr(obj, a)
            return obj
        raise LookupError(dotted)
    if parts[0] in vars(module):
        obj = vars(module)[parts[0]]
    else:
        try:
            obj = importlib.import_module(f"tl_lab.{parts[0]}")
        except ImportError:
            raise LookupError(dotted) from None
    for a in parts[1:]:
        obj = getattr(obj, a)
    return obj


def _named(text: str) -> list[str]:
    return [m.group(1) for m in _NAME.finditer(text) if m.group(2) is not None or "." in m.group(1)
            or m.group(1).startswith("_")]


@pytest.mark.parametrize("module", MODULES)
def test_every_helper_a_hint_names_is_one_the_module_has(module):
    mod = ref(module)
    for p in PIECES[module]:
        for name in re.findall(r"`([A-Za-z_][\w.]*)", p.hint):
            if name == p.formula.split("(")[0] or f"`{name}" in f"`{p.formula}":
                continue
            try:
                obj = _resolve(mod, name)
            except (LookupError, AttributeError):
                pytest.fail(f"the hint of {module}.{p.qualname} names `{name}`, which {module}.py does not have")
            base = name.split(".")[-1]
            cls = p.qualname.split(".")[0] if "." in p.qualname else None
            assert (base in vars(mod) and vars(mod)[base] is obj) or (cls and hasattr(vars(mod)[cls], base)), (
                f"the hint of {module}.{p.qualname} names `{name}`: {module}.py does not import it under that name")


@pytest.mark.parametrize("module", MODULES)
def test_every_helper_a_pieces_docstring_names_is_one_the_module_has(module):
    """A helper a piece's docstring names in backticks (`f(...)`, `kernels.f`, `tl_lab.x.f`, `_f`) exists, and one
    named through another module (`kernels.f`) is one this module imports: a learner calls what the stub
    imports (was: QLinear.forward named `kernels.matmul_q4`, the quant stub imports product_q4)."""
    mod = ref(module)
    tree = ast.parse(reference_source(module))
    bad = []
    for p in PIECES[module]:
        node, body = None, tree.body
        for part in p.qualname.split("."):
            node = next(n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part)
            body = node.body
        params = {a.arg for a in node.args.args + node.args.kwonlyargs}
        cls = vars(mod).get(p.qualname.split(".")[0]) if "." in p.qualname else None
        for name in _named(ast.get_docstring(node) or ""):
            first, base = name.split(".")[0], name.split(".")[-1]
            if first in params or first in ("self", "np", "numpy", "math") or (cls is not None and hasattr(cls, base)):
                continue
            try:
                obj = _resolve(mod, name)
            except (LookupError, AttributeError):
                bad.append(f"{p.qualname}: `{name}` does not exist")
                continue
            if "." in name and first not in vars(mod) and callable(obj) and not (
                    base in vars(mod) and vars(mod)[base] is obj):
                bad.append(f"{p.qualname}: `{name}` is not imported by {module}.py")
    assert not bad, f"{module}.py's docstrings name helpers the stub does not give: {bad}"


def test_the_wording_is_a_python_learners():
    texts = [*SECTIONS.values(), *(p.hint for p in ALL)]
    for t in texts:
        assert not re.search(r"\b\w+\.rs\b|Rust-owned", t), t
