"""Diagnosis by symptom, tried on learner mistakes written into a learner's own workspace module.

Issue 60: a pitfall is named only when the learner's output is that pitfall's output; an error in the
learner's code is its file, line and error; any other mistake is the first difference with its input
and the section to reread. Half of these mistakes are chapter pitfalls (each must be named, alone),
half are not (no pitfall may be named for them). Each is written into a workspace copy of the
reference, the file a learner would have, and tried with `exercise try` (`try_piece`).
"""

import re

import pytest

from tl_lab.lab.exercise.diagnose import Difference, explain
from tl_lab.lab.exercise.stubs import reference_source
from tl_lab.lab.exercise.diagnose import try_piece

# (name, module, piece tried, the correct text, the learner's text, the pitfall it is or None)
MISTAKES = [
    ("s08 truncating to f16", "quant", "f32_to_f16",
     "        h = x.astype(np.float16).view(np.uint16)\n",
     "        h = x.astype(np.float16).view(np.uint16)\n        h -= np.abs(h.view(np.float16).astype(np.float32)) > np.abs(x)\n", "s08"),
    ("s09 the odd column low", "quant", "pack_int4",
     "return nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)", "return nibbles[:, 1::2] | (nibbles[:, 0::2] << 4)", "s09"),
    ("s01 the shifts swapped", "sample", "Pcg32.uniform_f64",
     "return ((a >> 5) * 67108864 + (b >> 6))", "return ((a >> 6) * 67108864 + (b >> 5))", "s01"),
    ("s02 sequence 54", "sample", "stream",
     'return Pcg32(child_seed(seed, purpose), u64(purpose, "purpose"))', "return Pcg32(child_seed(seed, purpose), 54)", "s02"),
    ("s18 evicting the newest", "kv", "KvPool.alloc",
     "b, _ = self._lru.popitem(last=False)", "b, _ = self._lru.popitem(last=True)", "s18"),
    ("s04 > in the nucleus walk", "sample", "_top_p", "if c >= p:", "if c > p:", "s04"),
    ("s19 a zero-block pool let through", "kv", "KvCfg.validate",
     'as_int(self.n_blocks, "KvCfg.n_blocks", lo=1, error=KvError)', 'as_int(self.n_blocks, "KvCfg.n_blocks", lo=0, error=KvError)', "s19"),
    # not pitfalls of the chapter
    ("the old hint's child_seed", "sample", "child_seed",
     "return mix64((seed + purpose * GOLDEN_GAMMA) & MASK64)", "return mix64((seed + GOLDEN_GAMMA * (purpose + 1)) & MASK64)", None),
    ("a NameError", "sample", "mix64",
     "    return z ^ (z >> 31)\n", "    return z ^ (zz >> 31)\n", None),
    ("top-k kept in q order, not id order", "sample", "_top_k",
     "return sorted(_by_q_desc(q, range(len(q)))[:k])", "return _by_q_desc(q, range(len(q)))[:k]", None),
    ("bytes not handled by unpack_int4", "quant", "unpack_int4",
     "    if isinstance(packed, (bytes, bytearray, memoryview)):\n        packed = np.frombuffer(packed, dtype=np.uint8)\n", "", None),
    ("an off-by-one subnormal shift", "quant", "explain_f32_to_f16",
     "n_drop, field = min(13 + (-14 - e), 25), 0", "n_drop, field = min(14 + (-14 - e), 25), 0", None),
    ("int4 ties rounded up, not to even", "quant", "QLinear.quantize",
     "q = np.clip(np.rint(Wg / s), INT4_MIN, INT4_MAX)", "q = np.clip(np.floor(Wg / s + 0.5), INT4_MIN, INT4_MAX)", None),
    ("a 0-d array into f32_to_bf16 taken as a float", "quant", "f32_to_bf16",
     "    if not isinstance(x, np.ndarray):\n        return f32_to_bf16_scalar",
     "    if not isinstance(x, np.ndarray) or x.ndim == 0:\n        return f32_to_bf16_scalar", None),
]


def learner_workspace(tmp_path, module, old, new):
    src = reference_source(module)
    assert src.count(old) == 1, old
    (tmp_path / f"{module}.py").write_text(src.replace(old, new), encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize("name, module, piece, old, new, pitfall", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_a_mistake_is_diagnosed_by_its_symptom(tmp_path, name, module, piece, old, new, pitfall):
    ws = learner_workspace(tmp_path, module, old, new)
    res = try_piece(f"{module}.{piece}", ws)
    assert not res.passed, res
    text = "\n".join(res.diagnosis)
    named = set(re.findall(r"\bs\d\d\b", text))
    if pitfall:
        assert res.diagnosis[0].startswith(f"this is pitfall {pitfall} "), res
        assert named == {pitfall}, res  # alone
    else:
        assert not named and "pitfall s" not in text, res
        assert "differs from the reference" in text or " raised " in text, res
        assert "reread section" in text


def test_an_error_in_the_learners_code_is_its_file_line_and_error(tmp_path):
    ws = learner_workspace(tmp_path, "sample", "    return z ^ (z >> 31)\n", "    return z ^ (zz >> 31)\n")
    res = try_piece("sample.mix64", ws)
    line = (ws / "sample.py").read_text().splitlines().index("    return z ^ (zz >> 31)") + 1
    assert res.diagnosis[0] == f"sample.mix64 raised NameError at {ws / 'sample.py'}:{line}: name 'zz' is not defined"


def test_a_piece_not_written_says_so_and_no_workspace_says_how_to_start(tmp_path):
    from tl_lab.lab.exercise.cli import start

    start(tmp_path / "ws", ["quant"])
    res = try_piece("quant.f32_to_f16", tmp_path / "ws")
    assert not res.passed and "f32_to_f16 is not written yet" in repr(res)
    none = try_piece("quant.f32_to_f16", tmp_path / "nothing")
    assert not none.passed and repr(none).splitlines()[-1].startswith(f"no {tmp_path / 'nothing' / 'quant.py'}: start one with ")


def test_explain_a_difference_names_the_pitfall_whose_output_it_is():
    import numpy as np

    from tl_lab.quant import f32_to_f16

    x = np.array([1.00048828125, 65520.0, 0.1], np.float32)
    trunc = np.array([0x3C00, 0x7BFF, 0x2E66], np.uint16)  # what s08's truncation gives
    lines = explain(Difference("t", "quant.f32_to_f16", (x,), trunc, f32_to_f16(x)))
    assert lines[0].startswith("this is pitfall s08 ")
    other = np.array([0x3C00, 0x7C00, 0x2E67], np.uint16)  # not s08's
    lines = explain(Difference("t", "quant.f32_to_f16", (x,), other, f32_to_f16(x)))
    assert "this is pitfall" not in lines[0] and "index [2]: yours 0x2E67, the reference 0x2E66" in lines[0]
    lines = explain(Difference("t", "quant.f32_to_f16", (x,), None, None, ("ValueError", "bad", "/w/quant.py", 7)))
    assert lines[0] == "quant.f32_to_f16 raised ValueError at /w/quant.py:7: bad"


def _call(piece, args, kwargs, learner):
    import base64
    import pickle

    from tl_lab.lab.exercise.tries import encode

    return {"piece": piece, "args": base64.b64encode(pickle.dumps((args, kwargs))).decode(),
            "learner": learner if isinstance(learner, list) else encode(learner)}


def test_a_checks_failure_is_the_first_call_whose_answer_differs_from_the_references():
    """What the proxy logged (`remote.Connection.record`): calls that agree are passed over, an error of
    the reference's type agrees (the sentence may be the learner's); the first differing call is explained
    with the reference's answer computed on the grader's side, in hex."""
    import numpy as np

    from tl_lab.lab.exercise.diagnose import first_differing, from_calls, reference_answers

    x = np.array([1.0, 65520.0, 0.1], np.float32)
    calls = [_call("quant.f32_to_f16", (np.float32(1.0),), {}, np.uint16(0x3C00)),
             _call("quant.f32_to_f16", (x,), {}, np.array([0x3C00, 0x7C00, 0x2E67], np.uint16)),
             _call("quant.f32_to_f16", ("a string",), {}, ["raised", "TypeError", "no", "", 0, ["TypeError"]])]
    answers = reference_answers(calls)
    assert answers[0] == calls[0]["learner"]
    d = first_differing("t", calls, answers)
    assert d.piece == "quant.f32_to_f16" and d.raised is None and d.args[0].tolist() == x.tolist()
    lines = from_calls("quant", "t", calls)
    assert "no pitfall" in lines[0] and "index [2]: yours 0x2E67, the reference 0x2E66" in lines[0], lines
    raised = ["raised", "NameError", "name 'h' is not defined", "/w/quant.py", 12, ["NameError"]]
    lines = from_calls("quant", "t", [_call("quant.f32_to_f16", (x,), {}, raised)])
    assert lines[0] == "quant.f32_to_f16 raised NameError at /w/quant.py:12: name 'h' is not defined", lines


# ------------------------------------------------------------------ through `exercise check` (issue 60, done means)
# Twelve mistakes written into a learner's own module (a workspace file, as a learner would have it), each
# checked with `exercise check` (the graded tests in the parent, the learner's module behind the proxy):
# half are chapter pitfalls (the pitfall's own edit: named, alone), half are not (no pitfall named: the
# first difference, or the file, line and error). (name, module, the pitfall or None, old, new); a
# pitfall's old/new are None: its own edit.
CHECKED = [
    ("s08 truncating to f16", "quant", "s08", None, None),
    ("s09 the odd column low", "quant", "s09", None, None),
    ("s10 int4 rounded with the f32 scale", "quant", "s10", None, None),
    ("s01 the shifts swapped", "sample", "s01", None, None),
    ("s02 sequence 54", "sample", "s02", None, None),
    ("s07 negative logits divided", "sample", "s07", None, None),
    ("the old hint's child_seed", "sample", None,
     "return mix64((seed + purpose * GOLDEN_GAMMA) & MASK64)", "return mix64((seed + GOLDEN_GAMMA * (purpose + 1)) & MASK64)"),
    ("a NameError in mix64", "sample", None, "    return z ^ (z >> 31)\n", "    return z ^ (zz >> 31)\n"),
    ("top-k kept in q order, not id order", "sample", None,
     "return sorted(_by_q_desc(q, range(len(q)))[:k])", "return _by_q_desc(q, range(len(q)))[:k]"),
    ("bytes not handled by unpack_int4", "quant", None,
     "    if isinstance(packed, (bytes, bytearray, memoryview)):\n        packed = np.frombuffer(packed, dtype=np.uint8)\n", ""),
    ("int4 ties rounded up, not to even", "quant", None,
     "q = np.clip(np.rint(Wg / s), INT4_MIN, INT4_MAX)", "q = np.clip(np.floor(Wg / s + 0.5), INT4_MIN, INT4_MAX)"),
    ("a signalling NaN left signalling by f32_to_f16", "quant", None,
     "    nan = np.isnan(x)\n    if nan.any():  # numpy keeps", "    nan = np.isnan(x) & False\n    if nan.any():  # numpy keeps"),
]


def checked_workspace(tmp_path, module, pitfall, old, new):
    src = reference_source(module)
    if old is None:
        from tl_lab.lab.pitfalls import apply_edit, get

        for e in get(pitfall).edits:
            if e.module == f"tl_lab.{module}":
                src = apply_edit(src, e, pitfall)
    else:
        assert src.count(old) == 1, old
        src = src.replace(old, new)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / f"{module}.py").write_text(src, encoding="utf-8")
    return ws


@pytest.mark.exercise_slow
@pytest.mark.parametrize("name, module, pitfall, old, new", CHECKED, ids=[c[0] for c in CHECKED])
def test_a_mistake_in_the_learners_module_is_diagnosed_by_check(tmp_path, name, module, pitfall, old, new):
    from tl_lab.lab.exercise.grading import check

    ws = checked_workspace(tmp_path, module, pitfall, old, new)
    (row,) = check(ws, [module], timeout=120)
    assert row.state == "failed", (row.state, row.message)
    named = set(re.findall(r"\bs\d\d\b", row.hint))
    if pitfall:
        assert row.hint.startswith(f"this is pitfall {pitfall} "), row.hint
        assert named == {pitfall}, row.hint
    else:
        assert not named and "this is pitfall" not in row.hint, row.hint
        assert "differs from the reference" in row.hint or " raised " in row.hint, row.hint


@pytest.mark.exercise_slow  # a minute or more on a busy machine: the unit of from_calls above is the quick one
def test_one_mistake_through_check_quickly(tmp_path):
    """The unmarked one: a quant mistake that is no pitfall, through `exercise check`: the call the proxy
    saw and the reference's answer to it (hex), no pitfall."""
    from tl_lab.lab.exercise.grading import check

    c = CHECKED[-1]
    ws = checked_workspace(tmp_path, c[1], c[2], c[3], c[4])
    (row,) = check(ws, ["quant"], timeout=120)
    assert row.state == "failed" and "this is pitfall" not in row.hint, row.hint
    assert "quant.f32_to_f16 differs from the reference" in row.hint and "0x" in row.hint, row.hint
