"""`exercise try PIECE`: one piece of the learner's module on the chapter's cases and a few edge cases.

    python -m tl_lab exercise try quant.f32_to_f16
    from tl_lab import exercise; exercise.try_piece("quant.f32_to_f16")     # a notebook's inline check

The piece runs ALONE: the module tried is the learner's file with every other piece of the registry
put back to the reference's code (`hybrid_source`, done on the syntax tree, so the learner's lines
keep their numbers in a traceback), so a piece can be tried before the rest of the module is written
and a difference is this piece's. Each case is a small script (`CASES`: a function of the module
tried, returning what it observes: a value, an array, the pool's state after a scripted sequence of
calls, or the error raised). The learner's side runs in a child process of its own (their code is
untrusted: a time limit, its own process group, killed whole); the reference's, and the chapter's
pitfalls that edit this piece (each the reference with that pitfall's edit, for `diagnose`), in
another. The table: the case, yours, the reference's, the first difference. Seconds, not minutes.
"""

from __future__ import annotations

import ast
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import traceback
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path

import numpy as np

from tl_lab.lab.exercise.registry import MODULES, PIECES, SECTIONS, Piece
from tl_lab.lab.exercise.stubs import NOT_WRITTEN, ExerciseError, reference_source

__all__ = ["TryResult", "CaseResult", "try_piece", "piece_of", "hybrid_source", "CASES", "cases_for", "encode",
           "same", "show", "first_difference", "CHILD_SECONDS"]

CHILD_SECONDS = 60.0  # one side's whole run; honest code takes a second or two (forward's compile: ~5 s cold)


# ---------------------------------------------------------------------------------------------------
# Which piece, and the module it runs in
# ---------------------------------------------------------------------------------------------------


def piece_of(name: str) -> Piece:
    """"quant.f32_to_f16" or "kv.KvPool.alloc" (or "KvPool.alloc" when one module has it) -> its Piece."""
    module, _, qual = name.partition(".")
    if module in MODULES:
        found = [p for p in PIECES[module] if p.qualname == qual]
    else:
        found = [p for m in MODULES for p in PIECES[m] if p.qualname == name]
    if len(found) != 1:
        near = [f"{p.module}.{p.qualname}" for m in MODULES for p in PIECES[m]
                if name.split(".")[-1] in p.qualname]
        raise ExerciseError(f"no piece {name!r}: write it as MODULE.NAME, e.g. quant.f32_to_f16 or kv.KvPool.alloc"
                            + (f"; did you mean {', '.join(near[:4])}?" if near else f"; the modules are {', '.join(MODULES)}"))
    return found[0]


def _defs(tree: ast.Module) -> dict[str, tuple[list, int]]:
    """qualname ("f" or "Class.method") -> (the body list holding its def, its index there)."""
    out = {}
    for i, n in enumerate(tree.body):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[n.name] = (tree.body, i)
        elif isinstance(n, ast.ClassDef):
            for j, c in enumerate(n.body):
                if isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out[f"{n.name}.{c.name}"] = (n.body, j)
    return out


def hybrid_source(learner_text: str, module: str, keep: str, filename: str):
    """The code object of the learner's `learner_text` with every piece of `module` but `keep` replaced by
    the reference's definition (its decorators too). The learner's own helpers, imports and the piece
    `keep` stay as they wrote them, at their line numbers. A piece the learner's file lacks is the
    reference's; a SyntaxError is raised as it is."""
    mine = ast.parse(learner_text, filename)
    ref = _defs(ast.parse(reference_source(module)))
    where = _defs(mine)
    for p in PIECES[module]:
        if p.qualname == keep or p.qualname not in ref:
            continue
        body, i = ref[p.qualname]
        if p.qualname in where:
            mbody, j = where[p.qualname]
            mbody[j] = body[i]
    return compile(mine, filename, "exec", dont_inherit=True)


# ---------------------------------------------------------------------------------------------------
# What a case observed, as JSON: exact, typed, comparable
# ---------------------------------------------------------------------------------------------------


def encode(x, depth: int = 0):
    """A value as JSON that keeps its exact bits: ["int", "0x.."], ["float", dtype, hex], ["array", dtype,
    shape, hex of the bytes], ["bytes", hex], ["obj", class, {field: ...}], ["raised", ...] ..."""
    if depth > 8:
        return ["repr", repr(x)[:200]]
    if x is None or isinstance(x, (bool, np.bool_)):
        return ["bool", None if x is None else bool(x)]
    if isinstance(x, (int, np.integer)):
        return ["int", int(x)]
    if isinstance(x, (float, np.floating)):
        return ["float", np.asarray(x).dtype.name if isinstance(x, np.floating) else "float", float(x).hex()]
    if isinstance(x, np.ndarray):
        a = np.array(x, order="C", copy=True)  # not ascontiguousarray: it makes a 0-d array 1-d
        if a.dtype == object:
            return ["seq", [encode(v, depth + 1) for v in a.reshape(-1).tolist()]]
        return ["array", a.dtype.str, list(a.shape), a.tobytes().hex()]
    if isinstance(x, (bytes, bytearray, memoryview)):
        return ["bytes", bytes(x).hex()]
    if isinstance(x, str):
        return ["str", x]
    if isinstance(x, (list, tuple)):
        return ["seq", [encode(v, depth + 1) for v in x]]
    if isinstance(x, dict):
        return ["dict", [[str(k), encode(v, depth + 1)] for k, v in x.items()]]
    if isinstance(x, BaseException):
        return raised(x)
    if hasattr(x, "value") and type(x).__module__ == "enum" or type(x).__class__.__name__ == "EnumType":
        return ["str", str(x)]
    if is_dataclass(x):
        return ["obj", type(x).__name__, [[f.name, encode(getattr(x, f.name), depth + 1)] for f in fields(x)]]
    return ["repr", repr(x)[:200]]


def raised(exc: BaseException, learner_file: str | None = None):
    """["raised", type, message, file, line]: the place is the last frame in the learner's file, else
    the innermost one."""
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if learner_file and f.filename == learner_file]
    at = (mine or frames or [None])[-1]
    return ["raised", type(exc).__name__, str(exc)[:400], at.filename if at else "", at.lineno if at else 0,
            [c.__name__ for c in type(exc).__mro__]]


def same(a, b, close: float = 0.0) -> bool:
    """Whether two observations agree: bit for bit, or (close > 0) arrays and floats within `close` of
    the largest magnitude; two errors agree when their types do (the sentence may be the learner's)."""
    if a[0] == "raised" or b[0] == "raised":
        return a[0] == b[0] == "raised" and a[1] == b[1]
    if a[0] != b[0]:
        return False
    if a[0] in ("seq", "dict"):
        if len(a[1]) != len(b[1]):
            return False
        if a[0] == "dict":
            return all(x[0] == y[0] and same(x[1], y[1], close) for x, y in zip(a[1], b[1]))
        return all(same(x, y, close) for x, y in zip(a[1], b[1]))
    if a[0] == "obj":
        return a[1] == b[1] and len(a[2]) == len(b[2]) and all(
            x[0] == y[0] and same(x[1], y[1], close) for x, y in zip(a[2], b[2]))
    if close and a[0] in ("array", "float"):
        x, y = _num(a), _num(b)
        if x.shape != y.shape or x.dtype.kind != y.dtype.kind:
            return False
        if x.dtype.kind not in "fc":
            return np.array_equal(x, y)
        scale = max(float(np.nanmax(np.abs(y))) if y.size and np.isfinite(y).any() else 0.0, 1.0)
        return bool(np.array_equal(np.isnan(x), np.isnan(y)) and np.all(np.abs(np.nan_to_num(x - y)) <= close * scale))
    return a == b


def _num(e) -> np.ndarray:
    if e[0] == "float":
        return np.array([float.fromhex(e[2])])
    return np.frombuffer(bytes.fromhex(e[3]), dtype=np.dtype(e[1])).reshape(e[2])


def _scalar(v, dtype: np.dtype) -> str:
    """One element: integers of unsigned (bit pattern) arrays in hex, floats as exact hex and decimal."""
    if dtype.kind == "f":
        f = float(v)
        if math.isnan(f) or math.isinf(f):
            bits = np.asarray(v, dtype).view({2: np.uint16, 4: np.uint32, 8: np.uint64}[dtype.itemsize])
            return f"{f} (bits {int(bits):#0{dtype.itemsize * 2 + 2}x})"
        return f"{f.hex()} ({np.asarray(v, dtype).item()!r})" if dtype.itemsize < 8 else f"{f.hex()} ({f!r})"
    if dtype.kind == "u":
        return f"{int(v):#0{dtype.itemsize * 2 + 2}X}".replace("0X", "0x")
    if dtype.kind == "b":
        return str(bool(v))
    return _int(int(v))


def _int(v: int) -> str:
    return str(v) if -4096 <= v <= 4096 else (f"0x{v:X}" if v >= 0 else f"-0x{-v:X}")


def show(e, width: int = 60) -> str:
    """An observation in a line of at most ~`width` characters: a large array as its dtype, shape and first values."""
    kind = e[0]
    if kind == "bool":
        return "None" if e[1] is None else str(e[1])
    if kind == "int":
        return _int(e[1])
    if kind == "float":
        f = float.fromhex(e[2])
        return _scalar(np.asarray(f, np.dtype(e[1]) if e[1] != "float" else np.float64), np.dtype(e[1] if e[1] != "float" else "float64"))
    if kind == "str":
        return repr(e[1])[:width]
    if kind == "bytes":
        b = bytes.fromhex(e[1])
        return f"bytes[{len(b)}] {b[:12].hex(' ').upper()}{' ...' if len(b) > 12 else ''}"
    if kind == "raised":
        return f"raised {e[1]}: {e[2]}"[: width * 2]
    if kind == "array":
        a = _num(e)
        head = f"{a.dtype.name} {tuple(a.shape)}"
        flat = a.reshape(-1)
        if flat.size == 0:
            return f"{head} empty"
        shown = ", ".join(_scalar(v, a.dtype) if a.dtype.kind != "f" or flat.size <= 2 else _short(v) for v in flat[:6])
        return f"{head} [{shown}{', ...' if flat.size > 6 else ''}]"[: width * 2]
    if kind == "seq":
        return ("(" + ", ".join(show(v, 20) for v in e[1][:6]) + (", ..." if len(e[1]) > 6 else "") + ")")[: width * 2]
    if kind == "dict":
        return ("{" + ", ".join(f"{k}: {show(v, 16)}" for k, v in e[1][:8]) + (", ..." if len(e[1]) > 8 else "") + "}")[: width * 2]
    if kind == "obj":
        return (f"{e[1]}(" + ", ".join(f"{k}={show(v, 16)}" for k, v in e[2][:8]) + ")")[: width * 2]
    return str(e[1])[:width]


def _short(v) -> str:
    return repr(float(v)) if np.isfinite(v) else str(float(v))


def first_difference(mine, ref, path: str = "", close: float = 0.0) -> str:
    """Where two observations first differ, in words: the field or index, both values (hex for bit
    patterns and ints, floats as exact hex and decimal), the shapes of arrays that do not match."""
    if same(mine, ref, close):
        return ""
    at = f"at {path}: " if path else ""
    if mine[0] == "raised" and ref[0] != "raised":
        return f"{at}yours raised {mine[1]}: {mine[2]}; the reference returned {show(ref)}"
    if ref[0] == "raised" and mine[0] != "raised":
        return f"{at}the reference raises {ref[1]} ({ref[2]}); yours returned {show(mine)}"
    if mine[0] == ref[0] == "raised":
        return f"{at}yours raised {mine[1]}, the reference {ref[1]}: {ref[2]}"
    if mine[0] != ref[0]:
        return f"{at}yours is {show(mine)}, the reference's {show(ref)}"
    if mine[0] == "seq":
        if len(mine[1]) != len(ref[1]):
            return f"{at}yours has {len(mine[1])} items, the reference {len(ref[1])}: {show(mine)} vs {show(ref)}"
        for i, (x, y) in enumerate(zip(mine[1], ref[1])):
            d = first_difference(x, y, f"{path}[{i}]", close)
            if d:
                return d
    if mine[0] == "dict":
        for (k, x), (k2, y) in zip(mine[1], ref[1]):
            if k != k2:
                return f"{at}yours has key {k!r} where the reference has {k2!r}"
            d = first_difference(x, y, f"{path}[{k!r}]", close)
            if d:
                return d
        return f"{at}yours has keys {[k for k, _ in mine[1]]}, the reference {[k for k, _ in ref[1]]}"
    if mine[0] == "obj":
        for (k, x), (_, y) in zip(mine[2], ref[2]):
            d = first_difference(x, y, f"{path}.{k}" if path else k, close)
            if d:
                return d
    if mine[0] == "array":
        a, b = _num(mine), _num(ref)
        if a.dtype != b.dtype or a.shape != b.shape:
            return f"{at}yours is {a.dtype.name} {tuple(a.shape)}, the reference's {b.dtype.name} {tuple(b.shape)}"
        fa, fb = a.reshape(-1), b.reshape(-1)
        if a.dtype.kind == "f":
            diff = ~((fa == fb) | (np.isnan(fa) & np.isnan(fb)))
            if close:
                scale = max(float(np.nanmax(np.abs(fb))) if np.isfinite(fb).any() else 0.0, 1.0)
                diff &= ~(np.abs(np.nan_to_num(fa - fb)) <= close * scale)
            diff |= np.signbit(fa) != np.signbit(fb) if not close else False
        else:
            diff = fa != fb
        i = int(np.flatnonzero(diff)[0]) if diff.any() else 0
        idx = tuple(int(v) for v in np.unravel_index(i, a.shape)) if a.ndim else ()
        n = int(diff.sum())
        return (f"{at}{a.dtype.name} {tuple(a.shape)}, first difference at index {list(idx)}: yours "
                f"{_scalar(fa[i], a.dtype)}, the reference {_scalar(fb[i], b.dtype)} ({n} of {fa.size} differ)")
    return f"{at}yours {show(mine)}, the reference {show(ref)}"


# ---------------------------------------------------------------------------------------------------
# The cases: small scripts of the chapter's examples and the edge inputs the graded tests pass
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One case: `label` (what it feeds the piece), `run(m)` -> the observation, with `m` the module
    tried; `close`: arrays may differ within this fraction of the largest value (0: bit for bit)."""

    label: str
    run: object
    close: float = 0.0
    given: object = None  # the input array of an elementwise case: the difference names the element that shows it


def _f32(*v):
    return np.array(v, np.float32)


F16_EDGES = _f32(0.0, -0.0, 1.0, 0.1, 65504.0, 65519.0, 65520.0, 1e-8, 2.9802322e-08, 5.9604645e-08, 6.1e-05,
                 1.00048828125, 1.00146484375, -2.5, 3.4e38, np.inf, -np.inf, np.nan)
BF16_EDGES = _f32(0.0, -0.0, 1.0, 1.00390625, 1.01171875, 0.1, 3.3895314e38, 3.4e38, -3.4e38, 1e-40, 9.2e-41,
                  np.inf, -np.inf, np.nan)


def _call(fn, *args, **kw):
    return lambda m: getattr_path(m, fn)(*args, **kw)


def _each(label, fn, x, close=0.0):
    """An elementwise case: fn(x), with x kept to name the input of the first difference."""
    return Case(label, lambda m: getattr_path(m, fn)(x), close, given=x)


def getattr_path(m, dotted: str):
    obj = m
    for a in dotted.split("."):
        obj = getattr(obj, a)
    return obj


def _rng_matrix(shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def _quant_cases() -> dict[str, list[Case]]:
    f16_scalars = [1.0, 0.1, 65504.0, 65520.0, 5.9604645e-08, 2.9802322e-08, 1e-8, 6.097555e-05, 1.00048828125,
                   -2.5, float("inf"), float("nan"), -0.0]
    bf16_scalars = [1.0, 1.00390625, 1.01171875, 0.1, 3.4e38, 1e-40, float("nan"), -0.0]
    hs = [0x0000, 0x0001, 0x03FF, 0x0400, 0x3C00, 0x7BFF, 0x7C00, 0xFC00, 0x7E00, 0x8001]
    bhs = [0x0000, 0x0001, 0x3F80, 0x7F7F, 0x7F80, 0xFF80, 0x7FC1, 0x8000]
    out: dict[str, list[Case]] = {}
    out["round_half_even"] = [Case(f"round_half_even({s:#b}, {n})", _call("round_half_even", s, n))
                              for s, n in ((0b1011, 1), (0b1010, 1), (0b1001, 1), (0b10110, 2), (0b10010, 2),
                                           (0b10111, 2), (0x7FF, 3), (0b1101, 0))]
    out["explain_f32_to_f16"] = [Case(f"explain_f32_to_f16({x!r})", _call("explain_f32_to_f16", x)) for x in f16_scalars]
    out["explain_f32_to_bf16"] = [Case(f"explain_f32_to_bf16({x!r})", _call("explain_f32_to_bf16", x)) for x in bf16_scalars]
    out["f32_to_f16_scalar"] = [Case(f"f32_to_f16_scalar({x!r})", _call("f32_to_f16_scalar", x)) for x in f16_scalars]
    out["f32_to_bf16_scalar"] = [Case(f"f32_to_bf16_scalar({x!r})", _call("f32_to_bf16_scalar", x)) for x in bf16_scalars]
    out["f16_to_f32_scalar"] = [Case(f"f16_to_f32_scalar({h:#06x})", _call("f16_to_f32_scalar", h)) for h in hs]
    out["bf16_to_f32_scalar"] = [Case(f"bf16_to_f32_scalar({h:#06x})", _call("bf16_to_f32_scalar", h)) for h in bhs]

    def into(name):
        def run(m):
            out = np.full((2, 3), 7.0, np.float32)
            r = getattr(m, name)(np.arange(0x3C00, 0x3C06, dtype=np.uint16).reshape(2, 3), out=out)
            return [r is out, out]
        return run

    every = np.arange(65536, dtype=np.uint16)
    for name in ("f16_to_f32", "bf16_to_f32"):
        out[name] = [
            Case(f"{name}(0x3C00), a Python int", _call(name, 0x3C00)),
            _each(f"{name}(every pattern 0x0000 .. 0xFFFF), uint16 (65536,)", name, every),
            Case(f"{name}(a 0-d uint16 array 0x7E00)", _call(name, np.array(0x7E00, np.uint16))),
            Case(f"{name}(an empty uint16 array (0, 3))", _call(name, np.zeros((0, 3), np.uint16))),
            Case(f"{name}(uint16 (2, 3), out=a float32 (2, 3))", into(name)),
            Case(f"{name}(70000): not a 16-bit pattern", _call(name, 70000)),
            Case(f"{name}(a float32 array): not bits", _call(name, _f32(1.0))),
        ]
    roundtrip = np.arange(65536, dtype=np.uint16)
    finite16 = roundtrip[(roundtrip & 0x7C00) != 0x7C00]
    for name, edges, back, pats in (("f32_to_f16", F16_EDGES, "f16_to_f32", finite16),
                                    ("f32_to_bf16", BF16_EDGES, "bf16_to_f32", roundtrip[(roundtrip & 0x7F80) != 0x7F80])):
        out[name] = [
            Case(f"{name}(1.0), a Python float", _call(name, 1.0)),
            _each(f"{name}(the edges: ties, overflow, subnormals, inf, NaN), float32 {edges.shape}", name, edges),
            Case(f"{name}(a 0-d float32 NaN array)", _call(name, np.array(np.nan, np.float32))),
            Case(f"{name}(a 0-d float32 array 1.0)", _call(name, np.array(1.0, np.float32))),
            Case(f"{name}(an empty float32 array (0,))", _call(name, np.zeros(0, np.float32))),
            Case(f"{name}({back}(every finite pattern)): every pattern round-trips",
                 lambda m, name=name, back=back, pats=pats: getattr(m, name)(getattr(m, back)(pats))),
            _each(f"{name}(20,000 values in [-8, 8), float32, seed 0)", name,
                  np.random.default_rng(0).uniform(-8, 8, 20000).astype(np.float32)),
            _each(f"{name}(the f32 values around the target's subnormals, every 0x1234F-th pattern)", name,
                  np.arange(0x33000000 if name == "f32_to_f16" else 1, 0x38800000 if name == "f32_to_f16" else 0x00900000,
                            0x1234F, dtype=np.uint32).view(np.float32)),
        ]
    out["pack_int4"] = [
        Case("pack_int4([-8, 7, 1, -1], rows=1, cols=4): section 3's 0x78 0xF1", _call("pack_int4", [-8, 7, 1, -1], 1, 4)),
        Case("pack_int4(every value -8 .. 7 in pairs, rows=2, cols=16)",
             _call("pack_int4", np.array(list(range(-8, 8)) * 2).reshape(2, 16), 2, 16)),
        Case("pack_int4(an int8 (0, 4), rows=0, cols=4): no rows", _call("pack_int4", np.zeros((0, 4), np.int8), 0, 4)),
        Case("pack_int4([1, 2, 3], rows=1, cols=3): odd cols refused", _call("pack_int4", [1, 2, 3], 1, 3)),
        Case("pack_int4([8, 0], rows=1, cols=2): 8 is outside [-8, 7]", _call("pack_int4", [8, 0], 1, 2)),
        Case("pack_int4([1, 2, 3, 4], rows=2, cols=4): the size does not match", _call("pack_int4", [1, 2, 3, 4], 2, 4)),
    ]
    out["unpack_int4"] = [
        Case("unpack_int4(uint8 [[0x78, 0xF1]])", _call("unpack_int4", np.array([[0x78, 0xF1]], np.uint8))),
        Case("unpack_int4(bytes([0x78, 0xF1])): bytes, as a graded test passes them", _call("unpack_int4", bytes([0x78, 0xF1]))),
        Case("unpack_int4(every byte 0x00 .. 0xFF), uint8 (16, 16)", _call("unpack_int4", np.arange(256, dtype=np.uint8).reshape(16, 16))),
        Case("unpack_int4(an empty uint8 (0, 2))", _call("unpack_int4", np.zeros((0, 2), np.uint8))),
        Case("unpack_int4(an int8 array): not bytes", _call("unpack_int4", np.zeros((1, 2), np.int8))),
        Case("unpack_int4(a uint8 (2, 2, 2)): 3-D refused", _call("unpack_int4", np.zeros((2, 2, 2), np.uint8))),
    ]

    def q(w, group):
        def run(m):
            lay = m.QLinear.quantize(w, group)
            return [lay.qweight, lay.scales]
        return run

    hand = _f32(0.7, -1.4, 0.0, 0.29995).reshape(1, 4)
    rnd = _rng_matrix((4, 64), 1)
    zero = np.concatenate([np.zeros((2, 32), np.float32), _rng_matrix((2, 32), 2)], axis=1)
    quant_cases = [
        Case("QLinear.quantize(section 3's [0.7, -1.4, 0.0, 0.29995], group 4): qweight, scales", q(hand, 4)),
        Case("QLinear.quantize(float32 (4, 64) N(0, 1) seed 1, group 32)", q(rnd, 32)),
        Case("QLinear.quantize(an all-zero group beside a random one, group 32)", q(zero, 32)),
        Case("QLinear.quantize([[7, 2.5, -2.5, 0.5, 1.5, -0.5, 3.5, 6]], 8): s = 1, ties to even", q(_f32(7, 2.5, -2.5, 0.5, 1.5, -0.5, 3.5, 6).reshape(1, 8), 8)),
        Case("QLinear.quantize(weights of 1e6: past f16's scale range)", q(np.full((1, 4), 1e6, np.float32), 4)),
        Case("QLinear.quantize(tiny weights 1e-6: subnormal scales)", q(np.full((1, 4), 1e-6, np.float32) * _f32(1, -2, 3, -4), 4)),
    ]
    out["_group_scales"] = quant_cases
    out["QLinear.quantize"] = quant_cases
    out["QLinear.dequantize"] = [
        Case("QLinear.quantize(section 3's hand example, 4).dequantize()", lambda m: m.QLinear.quantize(hand, 4).dequantize()),
        Case("QLinear.quantize(float32 (4, 64) seed 1, 32).dequantize()", lambda m: m.QLinear.quantize(rnd, 32).dequantize()),
        Case("a QLinear of all-zero weights, dequantized", lambda m: m.QLinear.quantize(np.zeros((2, 8), np.float32), 4).dequantize()),
    ]
    out["QLinear.forward"] = [
        Case("QLinear.quantize(float32 (4, 64) seed 1, 32).forward(x (3, 64) seed 3)",
             lambda m: m.QLinear.quantize(rnd, 32).forward(_rng_matrix((3, 64), 3)), close=1e-5),
        Case("forward of a 1-D x (64,): one row", lambda m: m.QLinear.quantize(rnd, 32).forward(_rng_matrix((64,), 4)), close=1e-5),
        Case("forward(x (3, 63)): the wrong width is refused", lambda m: m.QLinear.quantize(rnd, 32).forward(_rng_matrix((3, 63), 3))),
        Case("forward(x (0, 64)): no rows", lambda m: m.QLinear.quantize(rnd, 32).forward(np.zeros((0, 64), np.float32))),
    ]
    out["_int4_pair_table"] = [
        Case("_int4_pair_table(np.int8): every byte's (low nibble, high nibble) values", _call("_int4_pair_table", np.int8)),
        Case("_int4_pair_table(np.float32): the same values as float32", _call("_int4_pair_table", np.float32)),
    ]
    return out


def _sample_cases() -> dict[str, list[Case]]:
    out: dict[str, list[Case]] = {}

    def draws(seed, seq, n=6, uniform=False):
        def run(m):
            g = m.Pcg32(seed, seq)
            return [g.uniform_f64() if uniform else g.next_u32() for _ in range(n)]
        return run

    gen = [Case(f"Pcg32({s:#x}, {q:#x}): {'six uniform_f64' if u else 'six next_u32'}", draws(s, q, uniform=u))
           for s, q in ((42, 54), (0, 0), (2**64 - 1, 2**64 - 1)) for u in (False, True)]
    gen.append(Case("Pcg32(-1, 0): a seed outside [0, 2**64)", lambda m: m.Pcg32(-1, 0)))
    out["Pcg32.__init__"] = gen
    out["Pcg32.next_u32"] = gen
    out["Pcg32.uniform_f64"] = gen
    out["mix64"] = [Case(f"mix64({z:#x})", _call("mix64", z)) for z in (0, 1, 0x9E3779B97F4A7C15, 2**64 - 1, 0x123456789ABCDEF0)]
    out["child_seed"] = [Case(f"child_seed({s:#x}, {p})", _call("child_seed", s, p))
                         for s, p in ((0, 4), (42, 4), (2**64 - 1, 3), (123456789, 0), (7, 2**64 - 1))]

    def st(seed, purpose):
        def run(m):
            g = m.stream(seed, purpose)
            return [g.next_u32() for _ in range(4)]
        return run

    out["stream"] = [Case(f"stream({s}, {p}): four next_u32", st(s, p)) for s, p in ((0, 4), (42, 4), (7, 1))]

    def smp(logits, seed, prompt=(), output=(), **params):
        def run(m):
            rng = m.stream(seed, 4)
            tok, lp = m.sample(np.array(logits, np.float32), m.SamplingParams(**params), list(prompt), list(output), rng)
            return [tok, lp, rng.next_u32()]
        label = ", ".join(f"{k}={v}" for k, v in params.items()) or "default params"
        return Case(f"sample({_fmt_list(logits)}, {label}, prompt {list(prompt)}, output {list(output)}, "
                    f"seed {seed}): token, logprob, the stream's next u32", run)

    hand = [1.0, 3.0, 2.0, 3.0, -1.0]
    big = np.random.default_rng(5).standard_normal(300).astype(np.float32) * 3
    sampler = [
        smp(hand, 0, temperature=1.0, top_k=3, top_p=0.8),
        smp(hand, 0, temperature=0.0),
        smp(hand, 1, temperature=0.7),
        smp([5.0, 5.0, 5.0, 5.0, -100.0], 0, top_p=0.5),
        smp([2.0, -1.0, 0.5, 3.0], 3, prompt=(0, 1), output=(1, 3, 3), repetition_penalty=1.5),
        smp([2.0, -1.0, 0.5, 3.0], 3, prompt=(0, 1), output=(1, 3, 3), presence_penalty=0.5, frequency_penalty=0.3),
        smp([2.0, -1.0, 0.5, 3.0], 9, prompt=(2,), output=(), presence_penalty=1.0, frequency_penalty=1.0),
        smp([0.0, 1.0, 2.0, 3.0], 11, min_p=0.3),
        smp([0.0, 0.0, 0.0, 0.0], 12, top_k=2),
        smp(big.tolist(), 4, temperature=0.9, top_k=40, top_p=0.95),
        smp(big.tolist(), 6, temperature=1.3),
    ]

    def trace(m):
        t = m.sample_trace(np.array(hand, np.float32), m.SamplingParams(temperature=1.0, top_k=3, top_p=0.8), [], [], m.stream(0, 4))
        return t

    def greedy_trace(m):
        return m.sample_trace(np.array(hand, np.float32), m.SamplingParams(temperature=0.0), [], [], None)

    sampler.append(Case("sample_trace(section 3's hand example): every stage", trace))
    sampler.append(Case("sample_trace(300 logits seed 5, T 1.3): every stage",
                        lambda m: m.sample_trace(big, m.SamplingParams(temperature=1.3), [], [], m.stream(6, 4))))
    sampler.append(Case("sample_trace(300 logits seed 5, T 0.9, top-k 40, top-p 0.95): every stage",
                        lambda m: m.sample_trace(big, m.SamplingParams(temperature=0.9, top_k=40, top_p=0.95), [], [], m.stream(4, 4))))
    sampler.append(Case("sample_trace(greedy, rng None): the stages a greedy call skips", greedy_trace))
    sampler.append(Case("sample(logits with a NaN)", lambda m: m.sample(_f32(1.0, np.nan), m.SamplingParams(), [], [], m.stream(0, 4))))
    sampler.append(Case("sample(a token id 9 in output, V = 4)", lambda m: m.sample(_f32(1, 2, 3, 4), m.SamplingParams(), [], [9], m.stream(0, 4))))
    for q in ("sample", "sample_trace"):
        out[q] = sampler
    # the steps, each alone on plain lists (docs/spec/sampling.md's steps 2 and 5 to 9)
    P = lambda **kw: (lambda m: m.SamplingParams(**kw))  # noqa: E731
    q4, w4 = [1.0, 3.0, 2.0, 3.0], [0.1353352832366127, 1.0, 0.36787944117144233, 1.0]
    out["_penalise"] = [
        Case("_penalise([2, -1, 0.5, 3], repetition 1.5, prompt [0, 1], output [1, 3, 3])",
             lambda m: m._penalise([2.0, -1.0, 0.5, 3.0], P(repetition_penalty=1.5)(m), [0, 1], [1, 3, 3])),
        Case("_penalise([2, -1, 0.5, 3], presence 0.5, frequency 0.3, prompt [2], output [1, 3, 3])",
             lambda m: m._penalise([2.0, -1.0, 0.5, 3.0], P(presence_penalty=0.5, frequency_penalty=0.3)(m), [2], [1, 3, 3])),
        Case("_penalise([-0.0, 1.0], nothing to do): -0.0 becomes +0.0",
             lambda m: [v.hex() for v in m._penalise([-0.0, 1.0], P()(m), [], [])]),
        Case("_penalise([1e300], frequency 1e300, output [0, 0]): past the range, refused",
             lambda m: m._penalise([-1e300], P(frequency_penalty=1e300)(m), [], [0, 0])),
    ]
    out["_scale"] = [Case("_scale([1, -2, 0], 0.5)", lambda m: m._scale([1.0, -2.0, 0.0], 0.5)),
                     Case("_scale([1e300], 1e-300): overflows, refused", lambda m: m._scale([1e300], 1e-300))]
    out["_by_q_desc"] = [Case("_by_q_desc([1, 3, 2, 3], all ids): ties to the lower id", lambda m: m._by_q_desc(q4, range(4))),
                         Case("_by_q_desc(q, [3, 0]): a subset", lambda m: m._by_q_desc(q4, [3, 0]))]
    out["_top_k"] = [Case(f"_top_k([1, 3, 2, 3], {k})", (lambda k: lambda m: m._top_k(q4, k))(k)) for k in (0, 1, 2, 3, 4, 5)]
    out["_top_p"] = [Case(f"_top_p([1, 3, 2, 3], w, all ids, {p})", (lambda p: lambda m: m._top_p(q4, w4, [0, 1, 2, 3], p))(p))
                     for p in (0.1, 0.40655354346409144, 0.5, 0.9, 1.0)]
    out["_top_p"].append(Case("_top_p(four equal weights, p 0.5): the crossing id kept",
                              lambda m: m._top_p([5.0] * 4, [1.0] * 4, [0, 1, 2, 3], 0.5)))
    out["_min_p"] = [Case(f"_min_p(w, all ids, {x})", (lambda x: lambda m: m._min_p(w4, [0, 1, 2, 3], x))(x)) for x in (0.0, 0.2, 0.5, 1.0)]
    out["_softmax"] = [Case("_softmax(w, [1, 2, 3])", lambda m: m._softmax(w4, [1, 2, 3])),
                       Case("_softmax(w, [0])", lambda m: m._softmax(w4, [0]))]
    out["_draw"] = [Case(f"_draw([1, 3], [0.25, 0.75], u={u})", (lambda u: lambda m: m._draw([1, 3], [0.25, 0.75], u))(u))
                    for u in (0.0, 0.2499, 0.25, 0.9999)]
    out["_draw"].append(Case("_draw: rounding leaves the total below u", lambda m: m._draw([0, 2], [0.5, 0.4999999], 0.99999)))
    out["_lsum"] = [Case("_lsum([1e16, 1, -1e16, 1]): left to right", lambda m: m._lsum([1e16, 1.0, -1e16, 1.0]).hex()),
                    Case("_lsum([])", lambda m: m._lsum([]))]
    return out


def _fmt_list(v) -> str:
    v = list(v)
    return "[" + ", ".join(f"{x:g}" for x in v[:5]) + (f", ... ({len(v)} logits)" if len(v) > 5 else "") + "]"


def _kv_cases() -> dict[str, list[Case]]:
    def snap(pool):
        n = pool.cfg.n_blocks
        return {"stats": pool.stats(), "free_list": pool.free_list(), "lru": pool.lru(),
                "blocks": [[str(pool.state(b)), pool.ref(b), pool.fill(b), pool.hash_of(b)] for b in range(n)]}

    def script(steps, n_blocks=6, B=4, prefix_cache=True):
        """steps: [(method, args)]: each call's result (or error), then the pool's state after the last."""
        def run(m):
            pool = m.KvPool(m.KvCfg(n_blocks, B, 1, 1, 4), prefix_cache=prefix_cache)
            got = []
            for name, args in steps:
                try:
                    got.append(getattr(pool, name)(*args))
                except Exception as exc:  # noqa: BLE001: the refusal is what this step observes
                    got.append(exc)
            return [got, snap(pool)]
        return run

    def label(steps):
        return "; ".join(f"{n}({', '.join(map(_hexish, a))})" for n, a in steps)

    lifecycle = [("alloc", (2,)), ("set_fill", (0, 4)), ("register", (0, 0xABC)), ("release", (0,)),
                 ("lookup", (0xABC,)), ("lookup", (0x999,)), ("retain", (0,)), ("release", (0,)), ("release", (0,)),
                 ("release", (1,))]
    evict = [("alloc", (4,)), *[s for b in range(4) for s in (("set_fill", (b, 4)), ("register", (b, 0x100 + b)))],
             *[("release", (b,)) for b in (2, 0, 3, 1)], ("alloc", (3,)), ("alloc", (2,)), ("lookup", (0x102,))]
    refusals = [("alloc", (7,)), ("alloc", (0,)), ("alloc", (-1,)), ("ref", (6,)), ("ref", (-1,)), ("retain", (3,)),
                ("release", (2,)), ("set_fill", (0, 1)), ("alloc", (1,)), ("set_fill", (0, 5)), ("register", (0, 0x1)),
                ("slab", (0, 1, False)), ("slab", (0, 0, 2))]
    dup = [("alloc", (2,)), ("set_fill", (0, 4)), ("set_fill", (1, 4)), ("register", (0, 0x7)), ("register", (1, 0x7)),
           ("set_fill", (0, 2)), ("release", (0,)), ("release", (1,))]
    nocache = [("alloc", (2,)), ("set_fill", (0, 4)), ("register", (0, 0x5)), ("release", (0,)), ("lookup", (0x5,))]
    cases = [Case(label(s), script(s)) for s in (lifecycle, evict, refusals, dup)]
    cases.append(Case("prefix_cache=False: " + label(nocache), script(nocache, prefix_cache=False)))

    def zero(n):
        return lambda m: (m.KvCfg(n, 4, 1, 1, 4).validate(), m.KvPool(m.KvCfg(n, 4, 1, 1, 4)).stats())

    cfg_cases = [Case("KvPool(KvCfg(0, 4, 1, 1, 4)): zero blocks", zero(0)),
                 Case("KvPool(KvCfg(1, 4, 1, 1, 4))", zero(1)),
                 Case("KvCfg(2, 4, 1, 1, 4, dtype='f32').validate()", lambda m: m.KvCfg(2, 4, 1, 1, 4, dtype="f32").validate()),
                 Case("KvCfg(2, 0, 1, 1, 4).validate(): zero block_tokens", lambda m: m.KvCfg(2, 0, 1, 1, 4).validate()),
                 Case("KvCfg(2.0, 4, 1, 1, 4).validate(): a float n_blocks", lambda m: m.KvCfg(2.0, 4, 1, 1, 4).validate())]

    def slab(m):
        pool = m.KvPool(m.KvCfg(3, 4, 2, 2, 4))
        b = pool.alloc(1)[0]
        s = pool.slab(b, 1, True)
        s[1, 2, 3] = 0x3C00
        return [s.shape, str(s.dtype), np.shares_memory(s, pool.data), pool.data[b, 1, 1]]

    def roundtrip(m):
        a = m.KvPool(m.KvCfg(4, 4, 2, 1, 4))
        ids = a.alloc(2)
        for i, b in enumerate(ids):
            for layer in range(2):
                for is_v in (False, True):
                    a.slab(b, layer, is_v)[...] = np.arange(16, dtype=np.uint16).reshape(1, 4, 4) + 0x3C00 + 16 * i + layer
            a.set_fill(b, 3 - i)
        blob = a.export(ids)
        c = m.KvPool(m.KvCfg(4, 4, 2, 1, 4))
        c.alloc(1)
        got = c.import_(blob)
        return [blob, got, c.data[got], [c.fill(b) for b in got], snap(c)]

    def bad_import(mutate, what):
        def run(m):
            a = m.KvPool(m.KvCfg(4, 4, 1, 1, 4))
            ids = a.alloc(1)
            a.slab(ids[0], 0, False)[...] = 0x3C00
            blob = bytearray(a.export(ids))
            c = m.KvPool(m.KvCfg(4, 4, 1, 1, 4))
            try:
                got = c.import_(bytes(mutate(blob)))
            except Exception as exc:  # noqa: BLE001
                got = exc
            return [got, snap(c)]
        return Case(f"import_(an envelope {what}): refused, nothing allocated", run)

    def flip(i):
        def f(b):
            b[i] ^= 0xFF
            return b
        return f

    envelope = [Case("export(2 written blocks) then import_ into another pool", roundtrip),
                bad_import(lambda b: b[:-3], "truncated by 3 bytes"),
                bad_import(flip(0), "with a wrong magic"),
                bad_import(flip(-1), "with its last byte flipped"),
                bad_import(lambda b: b + b"\0", "with a trailing byte"),
                Case("export([9]): an id outside the pool", lambda m: m.KvPool(m.KvCfg(4, 4, 1, 1, 4)).export([9])),
                Case("import_ into a pool of another shape", lambda m: m.KvPool(m.KvCfg(4, 4, 1, 1, 8)).import_(
                    (lambda a: a.export(a.alloc(1)))(m.KvPool(m.KvCfg(4, 4, 1, 1, 4)))))]
    out: dict[str, list[Case]] = {}
    for p in PIECES["kv"]:
        out[p.qualname] = cases + [Case("slab(b, 1, True): a view of the pool's data", slab)]
    out["KvCfg.validate"] = cfg_cases
    out["KvPool.__init__"] = cfg_cases + cases
    out["KvPool.slab"] = [Case("slab(b, 1, True): a view of the pool's data", slab), cases[2]]
    for q in ("KvPool.export", "KvPool.import_", "KvPool._parse"):
        out[q] = envelope
    out["prefix_hash"] = [
        Case("prefix_hash(None, [1, 2, 3, 4])", _call("prefix_hash", None, [1, 2, 3, 4])),
        Case("prefix_hash(0xABC, [1, 2, 3, 4]): the parent chained in", _call("prefix_hash", 0xABC, [1, 2, 3, 4])),
        Case("prefix_hash(None, []): no tokens", _call("prefix_hash", None, [])),
        Case("prefix_hash(None, int64 array [5, 6])", _call("prefix_hash", None, np.array([5, 6], np.int64))),
        Case("prefix_hash(2**64 - 1, [2**32 - 1]): the largest parent and id", _call("prefix_hash", 2**64 - 1, [2**32 - 1])),
        Case("prefix_hash(None, [2**32]): an id past u32, refused", _call("prefix_hash", None, [2**32])),
        Case("prefix_hash(-1, [1]): a parent that is no u64, refused", _call("prefix_hash", -1, [1])),
    ]
    out["prefix_hashes"] = [Case(f"prefix_hashes(list(range({n})), 4)", _call("prefix_hashes", list(range(n)), 4)) for n in (0, 3, 4, 9)]
    out["prefix_hashes"].append(Case("prefix_hashes([1, 2], 0): no block size, refused", _call("prefix_hashes", [1, 2], 0)))
    out["key_location"] = [
        Case("key_location([7, 2, 9], 37, 16): section 3's example", _call("key_location", [7, 2, 9], 37, 16)),
        Case("key_location([7, 2, 9], 0, 16)", _call("key_location", [7, 2, 9], 0, 16)),
        Case("key_location([7, 2, 9], 47, 16): the last position", _call("key_location", [7, 2, 9], 47, 16)),
        Case("key_location([7, 2, 9], 48, 16): one past the table, refused", _call("key_location", [7, 2, 9], 48, 16)),
        Case("key_location([7, 2, 9], array [0, 16, 37], 16)", _call("key_location", [7, 2, 9], np.array([0, 16, 37]), 16)),
        Case("key_location([7, 2, 9], -1, 16): refused", _call("key_location", [7, 2, 9], -1, 16)),
    ]
    return out


def _hexish(v) -> str:
    return _int(v) if isinstance(v, int) and not isinstance(v, bool) else repr(v)


def _safetensors(entries: dict, data: bytes, header_pad: str = "", metadata=None, raw_header: bytes | None = None) -> bytes:
    head = {**({"__metadata__": metadata} if metadata else {}), **entries}
    text = raw_header if raw_header is not None else (json.dumps(head) + header_pad).encode()
    return len(text).to_bytes(8, "little") + text + data


def _model_cases() -> dict[str, list[Case]]:
    from tl_lab.ops.paths import DATA_DIR

    a = np.arange(6, dtype=np.float32).reshape(2, 3) / 4
    h = np.array([0x3C00, 0xC000, 0x7BFF, 0x0001], np.uint16)
    bf = np.array([0x3F80, 0xC040, 0x7F7F, 0x0001], np.uint16)
    data = a.tobytes() + h.tobytes() + bf.tobytes()
    good = {"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
            "h": {"dtype": "F16", "shape": [4], "data_offsets": [24, 32]},
            "b": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [32, 40]}}
    variants = {
        "a good file: F32 (2, 3), F16 (4,), BF16 (2, 2)": _safetensors(good, data, "  "),
        "offsets counted from the start of the file (s11's reading)": _safetensors(
            {k: {**v, "data_offsets": [o + 8 for o in v["data_offsets"]]} for k, v in good.items()}, data),
        "a gap between two tensors": _safetensors({"a": good["a"], "h": {**good["h"], "data_offsets": [26, 34]}}, data[:34]),
        "two trailing bytes": _safetensors(good, data + b"\0\0"),
        "an unknown dtype F8": _safetensors({"a": {**good["a"], "dtype": "F8"}}, data[:24]),
        "a negative shape": _safetensors({"a": {**good["a"], "shape": [-2, -3]}}, data[:24]),
        "a duplicate key": _safetensors({}, data[:24], raw_header=b'{"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}, '
                                                                  b'"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}}'),
        "a header longer than the file": (10**6).to_bytes(8, "little") + b"{}",
        "7 bytes: no header length": b"\0" * 7,
        "a NaN in the header": _safetensors({}, b"", raw_header=b'{"__metadata__": {"x": NaN}}'),
        "an empty file of no tensors": _safetensors({}, b""),
        "metadata quant int4": _safetensors(good, data, metadata={"quant": "int4-g32-sym"}),
    }
    layout_cases = [Case(f"parse_layout({what})", (lambda buf: lambda m: m.parse_layout(buf))(buf)) for what, buf in variants.items()]

    def reader(buf, names):
        def run(m):
            with tempfile.TemporaryDirectory() as d:
                p = Path(d) / "model.safetensors"
                p.write_bytes(buf)
                with m.SafeTensors.open(p) as st:
                    return [st.names(), *[st.f32(n) for n in names], *[st.raw(n) for n in names]]
        return run

    read_cases = [Case("SafeTensors.open(the good file): f32 and raw of a, h, b", reader(variants[next(iter(variants))], ["a", "h", "b"])),
                  Case("SafeTensors.open(the s11 file): f32 of a", reader(variants["offsets counted from the start of the file (s11's reading)"], ["a"])),
                  Case("SafeTensors.open(the good file).f32('a', shape=(3, 2)): the wrong shape",
                       lambda m: _open_and(m, variants[next(iter(variants))], lambda st: st.f32("a", shape=(3, 2))))]
    cfg_text = (DATA_DIR / "tiny-llama" / "config.json").read_text()
    cfg = json.loads(cfg_text)

    def with_(**kw):
        c = {k: v for k, v in {**cfg, **kw}.items() if v is not _DROP}
        return json.dumps(c)

    config_cases = [Case(f"ModelConfig.from_json({what})", (lambda t: lambda m: m.ModelConfig.from_json(t))(t)) for what, t in {
        "the tiny Llama's config.json": cfg_text,
        "rope_scaling of type llama3": with_(rope_scaling={"rope_type": "llama3", "factor": 8.0}),
        "rope_scaling of type default": with_(rope_scaling={"rope_type": "default"}),
        "a sliding_window of 4096": with_(sliding_window=4096),
        "tl_arch 'mamba'": with_(tl_arch="mamba"),
        "no tl_tokenizer": with_(tl_tokenizer=_DROP),
        "5 heads for hidden size 64": with_(num_attention_heads=5),
        "3 KV heads for 4 heads": with_(num_key_value_heads=3),
        "rope_theta 0": with_(rope_theta=0),
        "rope_parameters' rope_theta disagreeing with rope_theta": with_(rope_parameters={"rope_theta": 1.0}),
        "vocab_size '256' (a string)": with_(vocab_size="256"),
        "a duplicate key": cfg_text.replace("{", '{"vocab_size": 256, ', 1),
        "NaN for rms_norm_eps": cfg_text.replace("{", '{"rms_norm_eps": NaN, ', 1) if "rms_norm_eps" not in cfg else with_(rms_norm_eps=_DROP).replace("{", '{"rms_norm_eps": NaN, ', 1),
    }.items()]
    config_cases.append(Case("ModelConfig.load(data/tiny-llama)", lambda m: m.ModelConfig.load(DATA_DIR / "tiny-llama")))

    def weights(d, quant=None):
        def run(m):
            w = m.load_weights(DATA_DIR / d, **({"quant": m.Int4(quant)} if quant else {}))
            return _weights_view(w)
        return run

    load_cases = [Case("load_weights(data/tiny-llama)", weights("tiny-llama")),
                  Case("load_weights(data/bigram)", weights("bigram")),
                  Case("load_weights(data/tiny-llama-int4)", weights("tiny-llama-int4")),
                  Case("load_weights(data/tiny-llama, quant=Int4(32))", weights("tiny-llama", 32)),
                  Case("tensor_shapes(the tiny Llama's config)", lambda m: m.tensor_shapes(m.ModelConfig.load(DATA_DIR / "tiny-llama")))]
    lin = [Case("Linear(w (3, 5) seed 0).forward(x (2, 5) seed 1)",
                lambda m: m.Linear(_rng_matrix((3, 5), 0)).forward(_rng_matrix((2, 5), 1)), close=1e-5),
           Case("Linear(w (3, 5)).forward(x (5,)): one row", lambda m: m.Linear(_rng_matrix((3, 5), 0)).forward(_rng_matrix((5,), 1)), close=1e-5),
           Case("Linear(w (3, 5)).forward(x (2, 4)): the wrong width", lambda m: m.Linear(_rng_matrix((3, 5), 0)).forward(_rng_matrix((2, 4), 1)))]
    stack = [Case("stack_linears(three f32 Linears (2, 4), (3, 4), (1, 4)): rows and parts",
                  lambda m: _stack_view(m.stack_linears([m.Linear(_rng_matrix((r, 4), r)) for r in (2, 3, 1)])))]
    out: dict[str, list[Case]] = {}
    for p in PIECES["model"]:
        out[p.qualname] = load_cases
    for q in ("ModelConfig.__post_init__", "ModelConfig._check_types", "ModelConfig._check_llama", "ModelConfig.from_json",
              "ModelConfig.load", "ModelConfig._from_checked_dict", "_rope_theta"):
        out[q] = config_cases
    for q in ("parse_layout", "_check_entry_count", "_parse_header_json", "_check_entries", "_check_entry", "_check_tiling"):
        out[q] = layout_cases
    for q in ("SafeTensors.open", "SafeTensors.raw", "SafeTensors.f32", "SafeTensors.f32_into", "SafeTensors._widening"):
        out[q] = read_cases + load_cases[:1]
    out["Linear.forward"] = lin
    out["stack_linears"] = stack + load_cases[:1]
    return out


_DROP = object()


def _open_and(m, buf, fn):
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "model.safetensors"
        p.write_bytes(buf)
        with m.SafeTensors.open(p) as st:
            return fn(st)


def _stack_view(r):
    whole, parts = r
    return [_lin(whole), [_lin(p) for p in parts]]


def _lin(x):
    for name in ("w", "qweight"):
        if hasattr(x, name):
            return [type(x).__name__, getattr(x, name)] + ([x.scales] if hasattr(x, "scales") else [])
    return repr(x)[:80]


def _weights_view(w):
    """A Weights as what a learner's loader is answerable for: the config, each array, each linear's weights."""
    out = {"type": type(w).__name__, "config": w.config}
    for f in fields(w):
        v = getattr(w, f.name)
        if isinstance(v, np.ndarray):
            out[f.name] = v
        elif isinstance(v, (list, tuple)) and v and is_dataclass(v[0]):
            out[f.name] = [{g.name: (_lin(getattr(x, g.name)) if hasattr(getattr(x, g.name), "forward") else getattr(x, g.name))
                            for g in fields(x) if not g.name.startswith("_")} for x in v]
        elif hasattr(v, "forward"):
            out[f.name] = _lin(v)
        elif f.name != "config" and not callable(v):
            out[f.name] = v if isinstance(v, (int, float, str, type(None))) else repr(v)[:80]
    return out


def _runner_view(m_runner, d="tiny-llama", quant=None, n_blocks=16):
    from tl_lab.ops.paths import DATA_DIR

    R = m_runner
    cfg = R.EngineConfig(kv=R.KvConfig(n_blocks=n_blocks, block_tokens=4), quant=quant)
    return R.ModelRunner.load(DATA_DIR / d, cfg)


def _forward_scenarios(where: str) -> list[Case]:
    """The engine's forward, end to end, with the module tried in place (`where`: forward or runner)."""

    def runner():
        import tl_lab.runner as R

        return R

    def prefill_decode(d="tiny-llama", quant=None):
        def run(m):
            R = runner()
            r = _runner_view(R, d, None if quant is None else R.Int4(quant))
            toks = list(b"The KV cache holds keys.")
            blocks = r.pool.alloc(7)
            rows = [r.forward(R.ForwardBatch([R.ForwardSeq(toks[:10], 0, blocks)])).data]
            for t in range(10, 14):
                rows.append(r.forward(R.ForwardBatch([R.ForwardSeq(toks[t:t + 1], t, blocks)])).data)
            return [np.concatenate(rows), [r.pool.fill(b) for b in blocks]]
        return run

    def batched(m):
        R = runner()
        r = _runner_view(R)
        a, b = r.pool.alloc(2), r.pool.alloc(2)
        z = r.forward(R.ForwardBatch([R.ForwardSeq(list(b"hello"), 0, a), R.ForwardSeq(list(b"abc"), 0, b)]))
        return [z.data, r.pool.data[a + b]]

    def once(m):
        R = runner()
        r = _runner_view(R)
        h, z = r.run_once(list(b"hi there"))
        return [h, z, r.pool.stats()]

    def bigram(m):
        R = runner()
        r = _runner_view(R, "bigram")
        blocks = r.pool.alloc(1)
        return r.forward(R.ForwardBatch([R.ForwardSeq(list(b"ab"), 0, blocks)])).data

    return [Case("the tiny Llama: prefill 10 tokens of 'The KV cache holds keys.', then 4 one-token steps: logits, fills",
                 prefill_decode(), close=1e-4),
            Case("two sequences in one step ('hello' and 'abc'): logits and the K/V written", batched, close=1e-3),
            Case("run_once('hi there'): hidden, logits, the pool after", once, close=1e-4),
            Case("the tiny Llama quantized at load (Int4(32)): prefill and decode logits", prefill_decode(quant=32), close=1e-4),
            Case("the bigram checkpoint: forward('ab')", bigram)]


def _forward_cases() -> dict[str, list[Case]]:
    x = _rng_matrix((3, 8), 0)
    w = _rng_matrix((8,), 1)
    pos = np.array([0, 1, 5, 17], np.int64)
    out: dict[str, list[Case]] = {}
    scen = _forward_scenarios("forward")
    for p in PIECES["forward"]:
        out[p.qualname] = scen
    out["rms_norm"] = [Case("rms_norm(x (3, 8) seed 0, w (8,) seed 1, 1e-5)", _call("rms_norm", x, w, 1e-5), close=1e-6),
                       Case("rms_norm(zeros (2, 8), w, 1e-5)", _call("rms_norm", np.zeros((2, 8), np.float32), w, 1e-5), close=1e-6)] + scen[:1]
    out["silu"] = [Case("silu([-20, -1, 0, 1, 20, 3.5])", _call("silu", _f32(-20, -1, 0, 1, 20, 3.5)), close=1e-6),
                   Case("silu(x (3, 8) seed 0)", _call("silu", x), close=1e-6)] + scen[:1]
    out["rope_inv_freq"] = [Case(f"rope_inv_freq({D}, {th})", _call("rope_inv_freq", D, th)) for D, th in ((8, 10000.0), (16, 500000.0), (2, 1.0))] + scen[:1]
    out["rope_cos_sin"] = [Case("rope_cos_sin(pos [0, 1, 5, 17], 8, 10000.0)", _call("rope_cos_sin", pos, 8, 10000.0), close=1e-6)] + scen[:1]
    out["rotate_half"] = [Case("rotate_half([[1, 2, 3, 4, 5, 6, 7, 8]])", _call("rotate_half", _f32(1, 2, 3, 4, 5, 6, 7, 8).reshape(1, 8))),
                          Case("rotate_half(x (3, 2, 8))", _call("rotate_half", _rng_matrix((3, 2, 8), 2)))] + scen[:1]

    def rope(m):
        cos, sin = m.rope_cos_sin(pos, 8, 10000.0)
        return m.rope(_rng_matrix((4, 2, 8), 3), cos[:, None, :], sin[:, None, :])

    out["rope"] = [Case("rope(x (4, 2, 8), the cos and sin of pos [0, 1, 5, 17])", rope, close=1e-6)] + scen[:1]
    out["kv_location"] = [Case("kv_location(table [5, 2, 9], pos 0 .. 11, B 4)", _call("kv_location", np.array([5, 2, 9]), np.arange(12), 4))]

    def write(m):
        data = np.zeros((4, 2, 2, 1, 4, 2), np.uint16)
        m.write_kv(data, 1, np.array([2, 0]), np.array([3, 1]), _f32(1, 2, 3, 4).reshape(2, 1, 2), _f32(-1, 0.1, 65520, 5).reshape(2, 1, 2))
        return data

    out["write_kv"] = [Case("write_kv(data, layer 1, blocks [2, 0], slots [3, 1], k, v): the pool after", write)] + scen[:2]
    out["Step.of"] = [Case("Step.of([([1, 2, 3], 0, [4]), ([7], 5, [0, 1])])", lambda m: m.Step.of([([1, 2, 3], 0, [4]), ([7], 5, [0, 1])]))] + scen[:2]
    out["bigram_forward"] = [Case("bigram_forward(table (4, 4), [3, 0])", _call("bigram_forward", _rng_matrix((4, 4), 5), np.array([3, 0])))] + scen[4:]
    return out


def _runner_cases() -> dict[str, list[Case]]:
    scen = _forward_scenarios("runner")

    def refusal(tokens, start, blocks_of):
        def run(m):
            R = m
            r = _runner_view(R)
            ok = r.pool.alloc(2)
            one = r.pool.alloc(1)
            freed = r.pool.alloc(1)
            r.pool.release(freed[0])
            blocks = blocks_of(ok, one, freed)
            before = r.pool.data.copy(), r.pool.stats()
            try:
                got = r.forward(R.ForwardBatch([R.ForwardSeq(list(b"fine"), 0, ok), R.ForwardSeq(tokens, start, blocks)])).data
            except Exception as exc:  # noqa: BLE001
                got = exc
            return [got, bool(np.array_equal(before[0], r.pool.data)), before[1] == r.pool.stats()]
        return run

    bad = [Case("forward: a block table too short for 20 tokens", refusal(list(range(20)), 0, lambda ok, one, f: one)),
           Case("forward: a position past the context", refusal([1, 2], 10**6, lambda ok, one, f: one)),
           Case("forward: token 256 outside the vocabulary of 256", refusal([5, 256, 7], 0, lambda ok, one, f: one)),
           Case("forward: token -1", refusal([-1], 0, lambda ok, one, f: one)),
           Case("forward: a freed block in the table", refusal([1, 2], 0, lambda ok, one, f: f)),
           Case("forward: block 99 of a 16-block pool", refusal([1], 0, lambda ok, one, f: [99])),
           Case("forward: a sequence of no tokens", refusal([], 0, lambda ok, one, f: one)),
           Case("forward: both sequences writing one block", refusal([1, 2], 0, lambda ok, one, f: ok))]

    def leaks(m):
        r = _runner_view(m)
        for _ in range(5):
            m_out = r.run_once(list(range(9)))
        return [r.pool.stats(), m_out[1]]

    out: dict[str, list[Case]] = {}
    for p in PIECES["runner"]:
        out[p.qualname] = scen + bad
    out["KvConfig.pool_cfg"] = [Case("KvConfig(8, 4).pool_cfg(2, 1, 16)", lambda m: m.KvConfig(8, 4).pool_cfg(2, 1, 16))] + scen[:1]
    for q in ("ModelRunner._check", "ModelRunner._check_tokens", "ModelRunner._check_table"):
        out[q] = bad + scen[1:2]
    for q in ("ModelRunner._run_temporary", "ModelRunner.run_once"):
        out[q] = [Case("five run_once(0 .. 8) on a 16-block pool: the pool after, the last logits", leaks, close=1e-4)] + scen[2:3]
    return out


_BUILDERS = {"quant": _quant_cases, "sample": _sample_cases, "kv": _kv_cases, "model": _model_cases,
             "forward": _forward_cases, "runner": _runner_cases}


def cases_for(module: str, qualname: str) -> list[Case]:
    """The cases of one piece (every piece of the registry has some: `tests/test_exercise_try.py`)."""
    return _BUILDERS[module]().get(qualname, [])


def CASES(module: str) -> dict[str, list[Case]]:  # noqa: N802 (a table, built on demand: numpy arrays inside)
    return _BUILDERS[module]()


# ---------------------------------------------------------------------------------------------------
# The child: one side (the learner's file, or the reference and its pitfalls) runs every case
# ---------------------------------------------------------------------------------------------------

def _holds_learner_names(name: str) -> bool:
    """Whether module `name` of sys.modules may hold names of a learner module: the six themselves and
    what imports them (tl_lab.engine, the readable sampler); tl_lab.ops imports none (section 2.1's
    layers), tl_lab.lab is the lab, both kept (no compile of the kernels again per side)."""
    mod = sys.modules.get(name)
    real = getattr(mod, "__name__", name) or name
    return real in {f"tl_lab.{m}" for m in MODULES} or real.startswith("tl_lab.engine")


def _fresh(module: str, code, filename: str):
    """Make `code` tl_lab.<module> in this process, with every tl_lab module that may hold its names
    imported afresh after it."""
    import importlib.util
    import types

    for name in [n for n in sys.modules if n.startswith("tl_lab.") and _holds_learner_names(n)]:
        del sys.modules[name]
    mod = types.ModuleType(f"tl_lab.{module}")
    mod.__file__ = filename
    mod.__spec__ = importlib.util.spec_from_loader(f"tl_lab.{module}", loader=None, origin=filename)
    sys.modules[f"tl_lab.{module}"] = mod
    try:
        exec(code, mod.__dict__)  # noqa: S102: the side this child runs
    except BaseException:
        del sys.modules[f"tl_lab.{module}"]
        raise
    setattr(sys.modules["tl_lab"], module, mod)  # as an import of tl_lab.<module> sets it
    return mod


def _side(module: str, qualname: str, label: str, code, filename: str, learner_file: str | None) -> dict:
    try:
        m = _fresh(module, code, filename)
    except BaseException as exc:  # noqa: BLE001: the module does not import: every case says so
        return {"label": label, "import_error": raised(exc, learner_file), "cases": []}
    got = []
    for case in cases_for(module, qualname):
        try:
            value = encode(case.run(m))
        except NotImplementedError as exc:
            value = raised(exc, learner_file)
            value[1] = "NotImplementedError"
        except RecursionError as exc:
            value = raised(exc, learner_file)
        except BaseException as exc:  # noqa: BLE001: the error is the observation (a KeyboardInterrupt or
            value = raised(exc, learner_file)  # SystemExit the learner's code raised too: was the child's end)
        got.append(value)
    return {"label": label, "import_error": None, "cases": got}


def _child_main(spec_path: str) -> None:
    from tl_lab.lab.exercise.sandbox import arm_stack

    arm_stack()  # the learner's side (sandbox.run(stack=True)): where a loop was, dumped before the time limit
    spec = json.loads(Path(spec_path).read_text())
    module = spec["module"]
    results = []
    for side in spec["sides"]:
        qualname = side["qualname"]
        if side["kind"] == "learner":  # in the sandbox: the code object the parent compiled (`_learner_job`)
            import marshal

            code = marshal.loads(Path(side["code"]).read_bytes())
            results.append(_side(module, qualname, side["label"], code, side["file"], side["file"]))
        else:
            from tl_lab.lab.pitfalls import apply_edit, get

            source = reference_source(module)
            path = str(Path(__import__("tl_lab").__file__).parent / f"{module}.py")
            for pid in side.get("pitfalls", []):
                for e in get(pid).edits:
                    if e.module == f"tl_lab.{module}" and e.function == qualname:
                        source = apply_edit(source, e, pid)
            results.append(_side(module, qualname, side["label"], compile(source, path, "exec", dont_inherit=True), path, None))
    sys.stdout.write("\n@@tl_lab-try@@" + json.dumps(results) + "\n")
    sys.stdout.flush()


def candidates(module: str, qualname: str) -> list[str]:
    """The chapter's pitfalls with an edit in this piece (what `diagnose` compares a learner's output with)."""
    from tl_lab.lab.pitfalls import PITFALLS

    return [p.id for p in PITFALLS.values() if any(e.module == f"tl_lab.{module}" and e.function == qualname for e in p.edits)]


def _env() -> dict:
    from tl_lab.ops.paths import REPO_ROOT

    env = {k: v for k, v in os.environ.items() if k not in ("TL_LAB_PITFALL", "TL_LAB_EXERCISE_USE")}
    env["TL_LAB_WORKSPACE"] = "off"  # the child serves the module itself (hybrid_source), not through the hook
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def _spawn(spec: dict, seconds: float):
    """Start one child on `spec` -> (Popen, spec file)."""
    from tl_lab.ops.paths import REPO_ROOT

    fd, path = tempfile.mkstemp(prefix="tl-try-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(spec, f)
    p = subprocess.Popen([sys.executable, "-c", f"from tl_lab.lab.exercise.tries import _child_main; _child_main({path!r})"],
                         cwd=REPO_ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)  # its own process group: killed whole on a time-out
    return p, path


def _collect(p, path: str, seconds: float) -> tuple[list | None, str]:
    try:
        out, err = p.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.communicate()
        return None, f"ran longer than {seconds:g} s (a loop that never ends?)"
    finally:
        Path(path).unlink(missing_ok=True)
    if "@@tl_lab-try@@" not in out:
        tail = (err or out).strip().splitlines()[-3:]
        return None, "the run ended without a verdict: " + " | ".join(tail)
    return json.loads(out.rsplit("@@tl_lab-try@@", 1)[1]), ""


def run_sides(module: str, qualname, learner_file: str | None, pitfalls=(), seconds: float = CHILD_SECONDS):
    """-> ({label: side result}, error text of the learner's child or ""): the learner's child and the
    reference's (with each of `pitfalls`) run at the same time. `qualname`: one piece, or several (the
    labels are then "yours:Q", "reference:Q" and "sNN:Q"); `pitfalls`: ids, or {qualname: ids}."""
    many = not isinstance(qualname, str)
    quals = list(qualname) if many else [qualname]
    tag = (lambda label, q: f"{label}:{q}") if many else (lambda label, q: label)
    by_piece = pitfalls if isinstance(pitfalls, dict) else {q: list(pitfalls) for q in quals}
    budget = seconds * max(1, len(quals) // 4)
    learner = _learner_job(module, quals, tag, learner_file, budget) if learner_file is not None else None
    ref_sides = [{"kind": "reference", "label": tag("reference", q), "qualname": q} for q in quals] + [
        {"kind": "reference", "label": tag(pid, q), "qualname": q, "pitfalls": [pid]} for q in quals for pid in by_piece.get(q, ())]
    p, path = _spawn({"module": module, "sides": ref_sides}, budget)
    out, err = {}, ""
    got, why = _collect(p, path, budget)
    if got is None:
        if learner is not None:
            learner()
        raise ExerciseError(f"exercise try: the reference's run of {module}.{qualname} failed: {why}")
    out.update({s["label"]: s for s in got})
    if learner is not None:
        got, err = learner()
        out.update({s["label"]: s for s in got or []})
    return out, err


LEARNER_OUTPUT = 64 << 20  # bytes of the learner child's output kept: its verdict's JSON (large arrays) and its prints


def _learner_job(module: str, quals: list[str], tag, learner_file, seconds: float):
    """Start the learner's side of `exercise try`: each piece's module (the learner's piece, the reference's
    others: `hybrid_source`) compiled HERE, run in a child through the sandbox (`sandbox.run`: bubblewrap
    where it works, the file tree read-only, no network; rlimits on memory, processes, files; `seconds` of
    wall clock; the output capped) -> a function that waits for it -> (its sides or None, the error or "")."""
    import marshal
    import threading

    from tl_lab.lab.exercise import sandbox
    from tl_lab.ops.paths import REPO_ROOT

    learner_file = str(learner_file)
    text = Path(learner_file).read_text(encoding="utf-8")
    tmp = Path(tempfile.mkdtemp(prefix="tl-try-"))
    sides, ready = [], []
    for q in quals:
        try:
            code = hybrid_source(text, module, q, learner_file)
        except SyntaxError as exc:
            ready.append({"label": tag("yours", q), "import_error": ["raised", "SyntaxError", exc.msg, learner_file,
                                                                     exc.lineno or 0, ["SyntaxError"]], "cases": []})
            continue
        (tmp / f"{len(sides)}.code").write_bytes(marshal.dumps(code))
        sides.append({"kind": "learner", "label": tag("yours", q), "qualname": q, "file": learner_file,
                      "code": str(tmp / f"{len(sides)}.code")})
    (tmp / "spec.json").write_text(json.dumps({"module": module, "sides": sides}))
    ws = Path(learner_file).parent
    cache = sandbox.numba_cache(ws)
    writable = [cache]
    env = {**_env(), "NUMBA_CACHE_DIR": str(cache), "PYTHONDONTWRITEBYTECODE": "1", "TMPDIR": "/tmp"}
    box: dict = {}

    def go():
        if not sides:
            return
        try:
            box["r"] = sandbox.run([sys.executable, "-c", "from tl_lab.lab.exercise.tries import _child_main; "
                                                          f"_child_main({str(tmp / 'spec.json')!r})"],
                                   workspace=ws, writable=writable, readable=[tmp], timeout=seconds, env=env,
                                   cwd=REPO_ROOT, output_cap=LEARNER_OUTPUT, stack=True)
        except Exception as exc:  # noqa: BLE001: said as the learner's side's error
            box["error"] = f"{type(exc).__name__}: {exc}"

    t = threading.Thread(target=go, daemon=True)
    t.start()

    def wait():
        t.join()
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        if not sides:
            return ready, ""
        if "error" in box:
            return None, box["error"]
        r = box["r"]
        if r.timed_out:
            where = sandbox.stuck_at(r.stack, [learner_file])  # its stack, dumped a little before the limit
            at = f" at {where[0]}:{where[1]} in {where[2]}" if where else ""
            return None, f"ran longer than {seconds:g} s{at} (a loop that never ends?)"
        if "@@tl_lab-try@@" not in r.stdout:
            tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
            why = f"exit code {r.returncode}" + (" (the memory limit?)" if r.returncode and r.returncode < 0 else "")
            return None, f"the run ended without a verdict ({why}): " + " | ".join(tail)
        try:
            got = json.loads(r.stdout.rsplit("@@tl_lab-try@@", 1)[1])
        except ValueError:
            return None, "the run's verdict could not be read (its output past the cap?)"
        return ready + got, ""

    return wait


# ---------------------------------------------------------------------------------------------------
# The verdict
# ---------------------------------------------------------------------------------------------------


@dataclass
class CaseResult:
    label: str
    yours: list | None
    reference: list
    close: float = 0.0
    given: object = None

    @property
    def ok(self) -> bool:
        return self.yours is not None and same(self.yours, self.reference, self.close)

    @property
    def not_written(self) -> bool:
        return self.yours is not None and self.yours[0] == "raised" and self.yours[1] == "NotImplementedError" \
            and NOT_WRITTEN in self.yours[2]

    def difference(self) -> str:
        if self.yours is None:
            return "not run"
        text = first_difference(self.yours, self.reference, close=self.close)
        x = self.given
        if isinstance(x, np.ndarray) and self.yours[0] == self.reference[0] == "array" and "first difference at index" in text:
            a, b = _num(self.yours), _num(self.reference)
            if a.shape == b.shape == x.shape:
                diff = (a != b) & ~((a != a) & (b != b)) if a.dtype.kind == "f" else a != b
                i = int(np.flatnonzero(diff.reshape(-1))[0])
                text += f"; the input there: {_scalar(x.reshape(-1)[i], x.dtype)}"
        return text


@dataclass
class TryResult:
    """`exercise try PIECE`'s verdict: each case's observations, the learner's file, and `diagnosis`
    (lines from `tl_lab.lab.exercise.diagnose`) when a case differs. `passed`: every case agrees."""

    piece: str
    file: str | None
    cases: list[CaseResult] = field(default_factory=list)
    note: str = ""  # a run that gave no case verdicts: no workspace, the module does not import, a time-out
    diagnosis: list[str] = field(default_factory=list)
    section: str = ""

    @property
    def passed(self) -> bool:
        return not self.note and bool(self.cases) and all(c.ok for c in self.cases)

    @property
    def not_written(self) -> bool:
        return any(c.not_written for c in self.cases)

    def __bool__(self) -> bool:
        return self.passed

    def lines(self) -> list[str]:
        head = f"exercise try {self.piece}" + (f": your {self.file}" if self.file else "")
        if self.note:
            return [head, self.note]
        if self.not_written:
            c = next(c for c in self.cases if c.not_written)
            return [head, f"{self.piece} is not written yet: {c.yours[2]}"]
        n_ok = sum(c.ok for c in self.cases)
        out = [head, f"{n_ok} of {len(self.cases)} cases agree with the reference"
               + ("" if n_ok == len(self.cases) else f" (reread {self.section})")]
        w = 44
        out.append(f"  {'':2} {'case':<{w}} {'yours':<34} reference")
        for c in self.cases:
            mark = "ok" if c.ok else "XX"
            yours = "-" if c.yours is None else show(c.yours, 30)
            out.append(f"  {mark} {_cut(c.label, w):<{w}} {_cut(yours, 34):<34} {_cut(show(c.reference, 30), 60)}")
            if not c.ok:
                out.append(f"     first difference: {c.difference()}")
        if self.diagnosis:
            out.append("diagnosis:")
            out.extend(f"  {line}" for line in self.diagnosis)
        return out

    def __repr__(self) -> str:
        return "\n".join(self.lines())

    __str__ = __repr__

    def _repr_html_(self) -> str:
        import html

        if self.note or self.not_written:
            return f"<pre>{html.escape(repr(self))}</pre>"
        rows = []
        for c in self.cases:
            colour = "#e6f4ea" if c.ok else "#fde8e8"
            diff = "" if c.ok else html.escape(c.difference())
            rows.append(f"<tr style='background:{colour}'><td>{'ok' if c.ok else '✗'}</td><td>{html.escape(c.label)}</td>"
                        f"<td><code>{html.escape('-' if c.yours is None else show(c.yours))}</code></td>"
                        f"<td><code>{html.escape(show(c.reference))}</code></td><td>{diff}</td></tr>")
        verdict = "every case agrees" if self.passed else f"{sum(c.ok for c in self.cases)} of {len(self.cases)} cases agree"
        diag = "".join(f"<li>{html.escape(d)}</li>" for d in self.diagnosis)
        return (f"<div><b>exercise try {html.escape(self.piece)}</b>: {verdict}<table>"
                f"<tr><th></th><th>case</th><th>yours</th><th>reference</th><th>first difference</th></tr>{''.join(rows)}"
                f"</table>{'<ul>' + diag + '</ul>' if diag else ''}</div>")


def _cut(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


def try_piece(name: str, workspace=None, seconds: float = CHILD_SECONDS, explain=None) -> TryResult:
    """Run piece `name` ("quant.f32_to_f16") of the learner's workspace against the reference on its
    cases -> TryResult (a readable repr and `_repr_html_` for a notebook, `.passed`). With no workspace,
    a one-line note saying how to start one. explain(result, piece, pitfall sides) -> the diagnosis
    lines of a failure (`tl_lab.lab.exercise.diagnose.try_piece` passes its own; None: no diagnosis)."""
    from tl_lab.lab.exercise.workspace import resolve

    piece = piece_of(name)
    full = f"{piece.module}.{piece.qualname}"
    section = f"section {piece.section} of the chapter, and section 4 ({piece.module}.py)"
    ws = resolve(workspace)
    f = ws / f"{piece.module}.py"
    if not f.is_file():
        from tl_lab.lab.exercise.workspace import command

        return TryResult(full, None, note=f"no {f}: start one with {command('start', piece.module, workspace=ws)}",
                         section=section)
    pids = candidates(piece.module, piece.qualname) if explain else []
    sides, err = run_sides(piece.module, piece.qualname, str(f), pids, seconds)
    cases = cases_for(piece.module, piece.qualname)
    ref = sides["reference"]
    res = TryResult(full, str(f), section=section)
    if err:
        res.note = f"your {f.name} ran longer than {seconds:g} s or crashed: {err}"
        return res
    mine = sides["yours"]
    if mine["import_error"]:
        e = mine["import_error"]
        res.note = f"your {f.name} does not import: {e[3]}:{e[4]}: {e[1]}: {e[2]}"
        return res
    res.cases = [CaseResult(c.label, y, r, c.close, c.given) for c, y, r in zip(cases, mine["cases"], ref["cases"])]
    if explain and not res.passed and not res.not_written:
        res.diagnosis = explain(res, piece, {p: sides[p] for p in pids})
    return res
