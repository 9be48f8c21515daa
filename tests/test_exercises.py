"""tl_lab/exercise: the learner's workspace, the stubs, and the chapter's tests as the verdict.

Kept honest: every stub imports and every graded test fails on it; a workspace of reference copies
passes `exercise check`; every piece a learner writes is graded (blanked alone, a graded test
fails: the `exercise_slow` tests, one run per piece); a pitfall's edit in a workspace copy fails
its test (the learner's file is what ran); start never overwrites, reset keeps a backup; the stubs
are the generator's output from the reference, nothing hand-kept.
"""

import ast
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from conftest import need
from tl_lab.exercise import registry
from tl_lab.exercise.cli import reset, start, written
from tl_lab.exercise.grading import _run, check, format_table, pitfall_hint
from tl_lab.exercise.registry import CATALOGUE, DEPS, MODULES, PIECES, graded
from tl_lab.exercise.stubs import ExerciseError, blank, learner_lines, reference_source, stub_source
from tl_lab.paths import REPO_ROOT
from tl_lab.pitfalls import PITFALLS, apply_edit

PY = sys.executable


def workspace(tmp_path, kind: str = "stub", modules=MODULES):
    """A workspace of stubs or of copies of the reference."""
    ws = tmp_path / "ws"
    ws.mkdir(parents=True, exist_ok=True)
    for m in modules:
        (ws / f"{m}.py").write_text(stub_source(m) if kind == "stub" else reference_source(m), encoding="utf-8")
    return ws


def cli(*args, env=None):
    full = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})}
    return subprocess.run([PY, "-m", "tl_lab", "exercise", *args], cwd=REPO_ROOT, env=full, capture_output=True,
                          text=True, timeout=900)


def outcomes(data) -> dict[str, str]:
    return {r["nodeid"]: r["outcome"] for r in data["results"]}


# ------------------------------------------------------------------ the registry and the stubs


def test_the_catalogue_is_the_chapters_24_each_with_tests():
    assert len(CATALOGUE) == 24 and len({g.name for g in CATALOGUE}) == 24
    ids = subprocess.run([PY, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          *sorted({g.file for g in CATALOGUE})], cwd=REPO_ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}).stdout.split()
    for g in CATALOGUE:
        assert [n for n in ids if registry.match(n) == g], f"no test of ours for {g.name}"
    assert all(registry.match(n) is None for n in ids if n.endswith("[reference]"))  # the given twin is not graded


def test_stubs_are_the_reference_with_only_the_learner_bodies_blanked():
    """No drift: the stub is generated from the reference (nothing is committed), every piece of the
    registry exists there, and outside the learner's bodies the stub is the reference line for line."""
    for m in MODULES:
        ref, stub = reference_source(m), stub_source(m)
        stub_tree, ref_tree = ast.parse(stub), ast.parse(ref)
        names = {p.qualname for p in PIECES[m]}
        for qual, fn in _functions(stub_tree).items():
            rfn = _functions(ref_tree)[qual]
            assert ast.unparse(fn.args) == ast.unparse(rfn.args) and ast.get_docstring(fn) == ast.get_docstring(rfn)
            body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
            if qual in names:
                assert len(body) == 1 and isinstance(body[0], ast.Raise), (m, qual)
                assert "NotImplementedError" in ast.unparse(body[0]) and "section" in ast.unparse(body[0])
            else:
                assert ast.unparse(fn) == ast.unparse(rfn), (m, qual)  # given code kept as it is
        assert set(_functions(stub_tree)) == set(_functions(ref_tree))
        assert stub == stub_source(m)  # deterministic
        assert sum(learner_lines(m).values()) > 0


def _functions(tree) -> dict:
    out = {}
    for n in tree.body:
        if isinstance(n, ast.FunctionDef):
            out[n.name] = n
        elif isinstance(n, ast.ClassDef):
            out.update({f"{n.name}.{c.name}": c for c in n.body if isinstance(c, ast.FunctionDef)})
    return out


def test_a_registry_name_the_reference_lacks_is_refused(monkeypatch):
    monkeypatch.setitem(PIECES, "sample", PIECES["sample"] + (registry.Piece("sample", "gone_fn", "2.6", "x"),))
    with pytest.raises(ExerciseError, match="gone_fn"):
        stub_source("sample")


def test_every_stub_imports_as_the_learners_and_says_where_it_came_from(tmp_path):
    ws = workspace(tmp_path)
    code = ("import json, tl_lab.kv, tl_lab.quant, tl_lab.model, tl_lab.forward, tl_lab.runner, tl_lab.sample\n"
            "from tl_lab.exercise import origins\nprint(json.dumps(origins()))")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TL_LAB_WORKSPACE": str(ws),
           "TL_LAB_EXERCISE_USE": ",".join(MODULES)}
    p = subprocess.run([PY, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    import json

    got = json.loads(p.stdout)
    assert {m: (o["origin"], o["loaded"]) for m, o in got.items()} == {m: ("learner", str(ws / f"{m}.py")) for m in MODULES}


def test_an_untouched_stub_comes_from_the_reference_and_a_traceback_shows_the_learners_line(tmp_path):
    ws = workspace(tmp_path, modules=["sample", "quant"])
    src = reference_source("quant").replace("def round_half_even(sig: int, n_drop: int) -> Rounding:\n",
                                            "def round_half_even(sig: int, n_drop: int) -> Rounding:\n    1 / 0\n", 1)
    (ws / "quant.py").write_text(src)
    line = src.splitlines().index("    1 / 0") + 1
    code = ("import tl_lab.sample, tl_lab.quant\nfrom tl_lab.exercise import origins\n"
            "o = origins(); print(o['sample']['origin'], o['quant']['origin'])\ntl_lab.quant.round_half_even(5, 1)")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TL_LAB_WORKSPACE": str(ws)}
    p = subprocess.run([PY, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert p.stdout.split() == ["reference", "learner"]
    assert f'File "{ws / "quant.py"}", line {line}, in round_half_even' in p.stderr and "1 / 0" in p.stderr


def test_the_projects_own_tests_see_no_workspace():
    """tests/conftest.py: a clone's work/L10.1 is not used unless TL_LAB_WORKSPACE asks for it."""
    from tl_lab.exercise import origins

    assert os.environ["TL_LAB_WORKSPACE"] == "off" or "PYTEST_XDIST_WORKER" in os.environ
    assert all(o["origin"] == "reference" for o in origins().values())


# ------------------------------------------------------------------ start, reset, bad input


def test_start_twice_never_overwrites_and_reset_keeps_a_backup(tmp_path):
    ws = tmp_path / "w" / "L10.1"
    assert [w for _, w in start(ws, MODULES)] == ["wrote"] * 6
    (ws / "kv.py").write_text("# mine\n")
    again = dict(start(ws, MODULES))
    assert set(again.values()) == {"left alone (it exists)"}
    assert (ws / "kv.py").read_text() == "# mine\n"
    backup, f = reset(ws, "kv")
    assert backup.read_text() == "# mine\n" and f.read_text() == stub_source("kv")
    backup2, _ = reset(ws, "kv")
    assert backup2 != backup and backup.read_text() == "# mine\n"  # an older backup is never replaced
    assert not any(p.name.startswith(".") for p in ws.iterdir() if p.suffix == ".new")


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    p = cli("check", "bogus", "--workspace", str(tmp_path))
    assert p.returncode == 2 and p.stderr.strip() == (
        "error: unknown module 'bogus': the learner's modules are kv, quant, model, forward, runner, sample")
    p = cli("status", "--workspace", str(tmp_path / "missing"))
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "does not exist" in p.stderr
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        p = cli("start", "--workspace", str(ro / "ws"))
        if os.geteuid() != 0:  # root writes anywhere
            assert p.returncode == 2 and p.stderr.startswith("error: cannot make the workspace"), p.stderr
    finally:
        ro.chmod(0o700)


COMMANDS = [["generate", "--model", "bigram", "--prompt", "ab", "--max-tokens", "2"], ["chat", "--model", "bigram"],
            ["fetch", "smollm2"], ["pitfalls"], *[["exercise", *c] for c in (
                ["status"], ["tests"], ["check", "sample"], ["hint", "kv"], ["reset", "kv"], ["parity"])]]


@pytest.mark.parametrize("kind", ["missing", "a file"])
def test_a_bad_TL_LAB_WORKSPACE_or_workspace_is_one_line_and_exit_2_for_every_command(tmp_path, kind):
    bad = tmp_path / "ws"
    if kind == "a file":
        bad.write_text("not a folder\n")
    why = "does not exist" if kind == "missing" else "is a file, not a folder"

    def run(argv, env):
        return subprocess.run([PY, "-m", "tl_lab", *argv], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                              stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **env})

    runs = [(argv, run(argv, {"TL_LAB_WORKSPACE": str(bad)})) for argv in COMMANDS]
    runs += [(argv, run([*argv, "--workspace", str(bad)], {"TL_LAB_WORKSPACE": "off"})) for argv in COMMANDS if
             argv[0] == "exercise"]
    for argv, p in runs:
        assert p.returncode == 2 and p.stdout == "", (argv, p.returncode, p.stdout, p.stderr)
        assert p.stderr.count("\n") == 1 and p.stderr.startswith("error: ") and f"workspace {bad} {why}" in p.stderr, (
            argv, p.stderr)
    start = run(["exercise", "start", "sample"], {"TL_LAB_WORKSPACE": str(bad)})
    if kind == "missing":  # start is what makes a workspace
        assert start.returncode == 0 and (bad / "sample.py").read_text() == stub_source("sample")
    else:
        assert start.returncode == 2 and start.stderr.count("\n") == 1 and why in start.stderr
        assert bad.read_text() == "not a folder\n"


def test_a_bad_TL_LAB_WORKSPACE_is_raised_where_a_program_imports_the_learners_modules(tmp_path):
    code = ("import tl_lab, tl_lab.tokenizer\ntry:\n    import tl_lab.sample\nexcept Exception as e:\n"
            "    print(type(e).__name__, e)")
    p = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "TL_LAB_WORKSPACE": str(tmp_path / "nope")})
    assert p.stdout == (f"ExerciseError TL_LAB_WORKSPACE={tmp_path / 'nope'}: workspace {tmp_path / 'nope'} does not "
                        "exist: python -m tl_lab exercise start writes it\n"), (p.stdout, p.stderr)


def test_an_unreadable_or_unwritable_workspace_is_named(tmp_path, monkeypatch):
    """Permissions through os.access (these tests may run as root, who reads and writes anything)."""
    from tl_lab.exercise.workspace import usable

    real = os.access
    for lacking, words, write in ((os.R_OK, "cannot be read", False), (os.W_OK, "is not writable", True)):
        monkeypatch.setattr(os, "access", lambda path, mode, lacking=lacking: not (mode & lacking) and real(path, mode))
        with pytest.raises(ExerciseError, match=f"^workspace {tmp_path} {words}"):
            usable(tmp_path, write=write)
        if lacking == os.W_OK:  # reading a workspace needs no write permission (generate, the notebooks)
            assert usable(tmp_path) == tmp_path
    monkeypatch.setattr(os, "access", real)
    assert usable(tmp_path, write=True) == tmp_path


def test_check_without_the_clones_tests_says_what_is_missing_and_exit_2(tmp_path):
    """A tl_lab installed by pip (the package alone, no tests/ beside it): one line naming the missing
    file and the clone, exit 2, nothing checked."""
    import shutil

    shutil.copytree(REPO_ROOT / "tl_lab", tmp_path / "site" / "tl_lab", ignore=shutil.ignore_patterns("__pycache__"))
    ws = workspace(tmp_path, "ref", ["sample"])
    p = subprocess.run([PY, "-m", "tl_lab", "exercise", "check", "sample", "--workspace", str(ws)], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(tmp_path / "site"), "TL_LAB_WORKSPACE": "off"})
    assert p.returncode == 2 and p.stdout == "" and p.stderr == (
        f"error: exercise check runs the chapter's tests from a clone of the repository, and this tl_lab "
        f"({tmp_path / 'site' / 'tl_lab'}) has no tests/conftest.py: clone it (README, Install), then run "
        f"python -m tl_lab exercise check from the clone\n"), p.stderr
    assert not (ws / ".tl_lab").exists()  # nothing checked, nothing written


def test_a_syntax_error_is_reported_with_file_and_line_and_the_rest_is_still_checked(tmp_path):
    ws = workspace(tmp_path, "ref", ["kv", "sample"])
    (ws / "kv.py").write_text(reference_source("kv").replace("class KvPool:", "class KvPool(:", 1))
    rows = {r.module: r for r in check(ws, ["kv", "sample"])}
    line = (ws / "kv.py").read_text().splitlines().index("class KvPool(:") + 1
    assert rows["kv"].state == "does not import" and f"{ws / 'kv.py'}:{line}: SyntaxError" in rows["kv"].message
    assert rows["sample"].state == "passed"


def test_an_infinite_loop_ends_at_the_time_limit_naming_the_test(tmp_path):
    ws = workspace(tmp_path, "ref", ["kv"])
    src = reference_source("kv").replace('    def validate(self) -> None:\n', '    def validate(self) -> None:\n        while True:\n            pass\n', 1)
    (ws / "kv.py").write_text(src)
    t0 = time.perf_counter()
    (row,) = check(ws, ["kv"], timeout=1)
    assert time.perf_counter() - t0 < 120
    assert row.state == "failed" and "ran longer than 1 s" in row.message
    assert "ran past the 1 s limit" in row.hint and row.first_failure


# ------------------------------------------------------------------ the verdicts


def test_every_graded_test_fails_on_the_stubs(tmp_path):
    """No graded test passes on unwritten code: each module's stub (the others the reference)."""
    ws = workspace(tmp_path)
    for m in MODULES:
        data, log, _ = _run(ws, m, [m], timeout=120)
        got = outcomes(data)
        assert {registry.match(n).name for n in got} == {g.name for g in graded(m)}, (m, log.read_text()[-2000:])
        assert all(v != "passed" for v in got.values()), (m, [n for n, v in got.items() if v == "passed"])


def test_a_complete_workspace_passes_check_and_a_half_done_one_says_not_started(tmp_path, record_property):
    ws = workspace(tmp_path, "ref")
    t0 = time.perf_counter()
    p = cli("check", "--workspace", str(ws))
    seconds = time.perf_counter() - t0
    record_property("check_seconds", round(seconds, 1))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "6 of 6 modules pass" in p.stdout and p.stdout.count("learner's file") == 6
    for m in ("kv", "quant", "model", "forward", "runner"):
        (ws / f"{m}.py").write_text(stub_source(m))
    p = cli("check", "--workspace", str(ws))
    assert p.returncode == 1 and p.stdout.count("not started") == 5 and "sample   passed" in p.stdout
    assert cli("check", "sample", "--workspace", str(ws)).returncode == 0
    p = cli("parity", "sampler", "rng", "--workspace", str(ws))
    assert p.returncode == 0 and "parity sampler: 12/12 cases identical" in p.stdout, p.stdout + p.stderr


def test_blocked_without_ref_deps_and_borrowed_with_it(tmp_path):
    ws = workspace(tmp_path, "ref", ["model"])
    (ws / "quant.py").write_text(stub_source("quant"))
    rows = {r.module: r for r in check(ws, ["model"])}
    assert rows["quant"].state == "not started" and rows["model"].state == "blocked"
    assert "blocked by quant" in rows["model"].message
    rows = {r.module: r for r in check(ws, ["model"], ref_deps=True)}
    assert rows["model"].state == "passed" and rows["model"].uses["quant"] == "reference (--ref-deps)"
    assert "quant: reference (--ref-deps)" in format_table(list(rows.values()))


def _learner_pitfalls():
    """Pitfalls whose every edit lies in a learner module (s14 edits the kernels, s17 the blocks)."""
    return [p for p in PITFALLS.values() if all(e.module.split(".")[1] in MODULES for e in p.edits)]


def _graded(ws, m, kwargs):
    """The graded tests of module m run on workspace ws (`_run` with `kwargs`) -> the run's data."""
    return _run(ws, m, [m], timeout=300, **kwargs)[0]


def _two_at_a_time(runs):
    """`_graded` on prepared `(workspace, module, kwargs)` runs, two pytest subprocesses at a time;
    returns each run's data. Every workspace is written beforehand in the calling thread: CPython
    3.11's ast is not safe from two threads at once ("SystemError: AST constructor recursion depth
    mismatch"), and writing a workspace parses the reference."""
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(lambda r: _graded(*r), runs))


def _pitfall_workspace(tmp_path, p):
    """A workspace of reference copies whose module of pitfall `p` has the pitfall written in."""
    m = p.module.split(".")[1]
    ws = workspace(tmp_path / p.id, "ref", [m])
    src = reference_source(m)
    for e in p.edits:
        src = apply_edit(src, e, p.id)
    (ws / f"{m}.py").write_text(src)
    return ws, m, {"tests": [p.test]}


@pytest.mark.parametrize("pid", ["s04", "s08", "s18"])
def test_a_pitfall_in_the_workspace_copy_fails_its_test(tmp_path, pid):
    p = PITFALLS[pid]
    ws, m, run = _pitfall_workspace(tmp_path, p)
    data = _graded(ws, m, run)
    assert outcomes(data) and all(v == "failed" for v in outcomes(data).values()), data
    assert data["origins"][m]["loaded"].startswith(str(tmp_path))
    failing = data["results"][0]
    assert f"this is what {pid}" in pitfall_hint(m, failing["nodeid"], failing["message"])


@pytest.mark.exercise_slow
def test_every_learner_pitfall_in_the_workspace_copy_fails_its_test(tmp_path):
    ps = _learner_pitfalls()
    assert len(ps) == 20
    runs = _two_at_a_time([_pitfall_workspace(tmp_path, p) for p in ps])
    missed = [p.id for p, data in zip(ps, runs) if not outcomes(data) or "failed" not in outcomes(data).values()]
    assert not missed


def _blanked_workspace(tmp_path, m, qualname):
    """A workspace whose `m`.py is the reference with only `qualname`'s body blanked."""
    ws = tmp_path / f"{m}-{qualname}"
    ws.mkdir()
    (ws / f"{m}.py").write_text(blank(reference_source(m), m, {qualname}))
    return ws, m, {"first_failure": True}


@pytest.mark.exercise_slow
@pytest.mark.parametrize("module", MODULES)
def test_every_piece_blanked_alone_fails_a_graded_test(tmp_path, module, record_property):
    """Every piece a learner writes is graded: the reference with only that body blanked fails at
    least one of the module's graded tests (two pytest runs at a time, each stopping at its first
    failure)."""
    t0 = time.perf_counter()
    names = [p.qualname for p in PIECES[module]]
    runs = _two_at_a_time([_blanked_workspace(tmp_path, module, q) for q in names])
    record_property("seconds", round(time.perf_counter() - t0, 1))
    ungraded = [q for q, data in zip(names, runs) if data is None or "failed" not in outcomes(data).values()]
    assert not ungraded, f"{module}: blanked alone, these fail no graded test: {ungraded}"


def test_written_counts_the_pieces_left_to_write(tmp_path):
    ws = workspace(tmp_path, modules=["forward"])
    assert not any(written(ws, "forward").values())
    (ws / "forward.py").write_text(blank(reference_source("forward"), "forward", {"silu"}))
    done = written(ws, "forward")
    assert [q for q, v in done.items() if not v] == ["silu"]
    assert DEPS["forward"] == ("quant", "kv", "model")


def _nbval(ws, *notebooks):
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TL_LAB_WORKSPACE": str(ws)}
    return subprocess.run([PY, "-m", "pytest", "--nbval-lax", "-q", "-p", "no:cacheprovider",
                           *[f"notebooks/{n}.ipynb" for n in notebooks]], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=900)


def test_the_sampler_and_kv_notebooks_run_on_a_complete_workspace(tmp_path):
    """The section notebooks run the learner's files: 04 and 07 pass on a workspace of reference
    copies, and 07 fails on one whose sample.py has the pitfall s04 (so 07 really ran that file)."""
    ws = workspace(tmp_path, "ref")
    p = _nbval(ws, "07_sampler", "04_kv_pool")
    assert p.returncode == 0, p.stdout[-3000:]
    src = reference_source("sample")
    for e in PITFALLS["s04"].edits:
        src = apply_edit(src, e, "s04")
    (ws / "sample.py").write_text(src)
    p = _nbval(ws, "07_sampler")
    assert p.returncode == 1 and "failed" in p.stdout.splitlines()[-1], p.stdout[-3000:]


def _run_cells(ws, notebook: str, monkeypatch, code_cells=(0, 1)) -> list[tuple[str, str | None]]:
    """Code cells `code_cells` (indices among the code cells) of `notebook`, run in a python3 kernel
    (nbclient) whose TL_LAB_WORKSPACE is `ws` -> per cell (its text output, its error name or None)."""
    nbformat, nbclient = need("nbformat"), need("nbclient")
    nb = nbformat.read(REPO_ROOT / "notebooks" / f"{notebook}.ipynb", 4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    nb.cells = [code[i] for i in code_cells]
    monkeypatch.setenv("TL_LAB_WORKSPACE", str(ws))
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(REPO_ROOT / "notebooks")}}).execute()
    return [("".join(o.get("text", "") for o in c.outputs),
             next((o.ename for o in c.outputs if o.output_type == "error"), None)) for c in nb.cells]


def _first_cells(ws, notebook: str, monkeypatch) -> list[str]:
    """The text output of the first two code cells (the first cell, the imports); neither may raise."""
    out = _run_cells(ws, notebook, monkeypatch)
    assert [e for _, e in out] == [None, None], out
    return [text for text, _ in out]


def test_a_notebook_whose_learner_module_raises_shows_the_error_and_hint_and_runs_to_the_end(tmp_path, monkeypatch):
    """tl_lab.exercise.guard through each section notebook's first cell: kv.py with a SyntaxError,
    quant.py with a NameError at import, sample.py raising at call. The first cell names each with
    its file, line and hint, the reference runs in their place, and 04 and 07 run to the end."""
    ws = workspace(tmp_path, "ref")
    kv = reference_source("kv").replace("class KvPool:", "class KvPool(:", 1)
    quant = reference_source("quant").replace("\nclass QLinear:", "\nundefined_name\n\nclass QLinear:", 1)
    sample = reference_source("sample").replace("    M = float(l.max())\n", "    M = float(l.maximum())\n", 1)
    for m, src in (("kv", kv), ("quant", quant), ("sample", sample)):
        assert src != reference_source(m)
        (ws / f"{m}.py").write_text(src)
    line = {m: src.splitlines().index(text) + 1 for m, src, text in
            (("kv", kv, "class KvPool(:"), ("quant", quant, "undefined_name"), ("sample", sample, "    M = float(l.maximum())"))}

    first, imports = _first_cells(ws, "04_kv_pool", monkeypatch)
    assert imports == ""
    for m, what in (("kv", "SyntaxError"), ("quant", "NameError: name 'undefined_name' is not defined"),
                    ("sample", "AttributeError")):
        assert f"!! your {m}.py raises, so this notebook runs the reference's {m} in its place" in first, first
        assert f"{ws / f'{m}.py'}:{line[m]} in " in first and what in first, first
    assert "hint: every step of docs/spec/sampling.md" in first  # the piece it raised in: sample's _run
    assert "python -m tl_lab exercise hint kv" in first
    assert f"model    learner   {ws / 'model.py'}" in first  # the modules that run stay the learner's

    p = _nbval(ws, "04_kv_pool", "07_sampler")
    assert p.returncode == 0, p.stdout[-3000:]


NOT_ACTIVATED = {
    "10_pitfalls": "a pitfall edits the reference's text: pitfalls and a workspace do not combine",
    "11_interface": "it runs the project's own tests on the interface, item by item: the reference's",
    "13_your_turn": "it drives the exercise itself, in a workspace of its own under the project's tests",
}


def test_every_section_notebook_using_a_learner_module_activates_the_workspace_first():
    """The guard is one mechanism for every section notebook: the first code cell of each notebook
    that imports one of the six is exercise.activate(), before any of them is imported."""
    import re

    nbformat = need("nbformat")
    pattern = re.compile(r"(from tl_lab\.(%s) import|import tl_lab\.(%s)\b)" % ("|".join(MODULES), "|".join(MODULES)))
    seen = []
    for f in sorted((REPO_ROOT / "notebooks").glob("*.ipynb")):
        code = [c.source for c in nbformat.read(f, 4).cells if c.cell_type == "code"]
        if f.stem in NOT_ACTIVATED or not any(pattern.search(c) for c in code):
            continue
        assert "exercise.activate()" in code[0] and not pattern.search(code[0]), f.stem
        seen.append(f.stem)
    assert len(seen) >= 10 and {"04_kv_pool", "05_forward", "07_sampler"} <= set(seen), seen


def test_the_guard_stops_a_loop_and_survives_an_exit(tmp_path, monkeypatch):
    """A learner module that never ends its trial, or ends the process, is a Fault naming it; the
    other modules are tried again without it and stay the learner's."""
    from tl_lab.exercise import guard

    ws = workspace(tmp_path, "ref", ["kv", "sample"])
    (ws / "sample.py").write_text(reference_source("sample") + "\nwhile True:\n    pass\n")
    monkeypatch.setattr(guard, "TIMEOUT", 20.0)
    faults = guard.trial(ws, ["kv", "sample"])
    assert list(faults) == ["sample"] and faults["sample"].error == "ran longer than 20 s", faults
    (ws / "kv.py").write_text(reference_source("kv") + "\nimport sys\nsys.exit(3)\n")
    (ws / "sample.py").write_text(reference_source("sample"))
    faults = guard.trial(ws, ["kv", "sample"])
    assert list(faults) == ["kv"] and faults["kv"].error.startswith("the process ended"), faults


def test_a_bad_workspace_in_a_notebook_is_one_line_and_the_reference_runs(tmp_path, monkeypatch):
    first, imports = _first_cells(tmp_path / "missing", "04_kv_pool", monkeypatch)
    assert first.splitlines()[0] == (f"error: TL_LAB_WORKSPACE={tmp_path / 'missing'}: workspace "
                                     f"{tmp_path / 'missing'} does not exist: python -m tl_lab exercise start writes "
                                     "it; this notebook runs the reference's modules (fix it, then restart the kernel)")
    assert "Traceback" not in first and imports == ""


def test_05_holds_the_learners_forward_against_hf_and_the_reference(tmp_path, monkeypatch):
    """Notebook 05's central claim with a workspace: the runner is the learner's, and the reference's
    runs the same golden cases beside it. A forward that skips the final norm (s16) is OUTSIDE the
    bound beside a reference within it, and the cell's assert fails: the learner's forward ran."""
    import nbformat

    ws = workspace(tmp_path, "ref", ["quant", "kv", "model", "forward", "runner"])
    src = reference_source("forward")
    for e in PITFALLS["s16"].edits:
        src = apply_edit(src, e, "s16")
    (ws / "forward.py").write_text(src)
    code = [c for c in nbformat.read(REPO_ROOT / "notebooks" / "05_forward.ipynb", 4).cells if c.cell_type == "code"]
    claim = next(i for i, c in enumerate(code) if c.source.startswith("cases = hf_golden_cases()"))
    (first, _), (_, err), (text, claim_err) = _run_cells(ws, "05_forward", monkeypatch, (0, 1, claim))
    assert f"forward  learner   {ws / 'forward.py'}" in first and err is None
    lines = [s for s in text.splitlines() if " tokens: yours " in s]
    assert len(lines) == 6 and all(s.endswith("OUTSIDE") for s in lines), text
    ref = [float(s.split("the reference's ")[1].split(",")[0]) for s in lines]
    bound = [float(s.split("bound ")[1].split(":")[0]) for s in lines]
    assert all(r <= b for r, b in zip(ref, bound)) and claim_err == "AssertionError"


def test_a_learner_module_that_does_not_import_is_a_printed_line(tmp_path, capsys):
    from tl_lab.exercise.side import yours_or_none

    ws = workspace(tmp_path, modules=["sample"])
    assert yours_or_none("sample", ws) is None and capsys.readouterr().out == ""  # the stub: nothing yet
    (ws / "sample.py").write_text("x = 1\ndef broken(:\n")
    assert yours_or_none("sample", ws) is None
    assert f"your sample.py does not import: {ws / 'sample.py'}:2: SyntaxError" in capsys.readouterr().out


# ------------------------------------------------------------------ pieces' sizes, catalogue ids, the workspace


def test_learner_lines_are_the_lines_each_stub_takes_out():
    """Each piece's body of n lines becomes one raise: the stub is shorter by n - 1 per piece."""
    for m in MODULES:
        header = 3  # the stub's own lines above the reference's
        removed = len(reference_source(m).splitlines()) - (len(stub_source(m).splitlines()) - header)
        sizes = learner_lines(m)
        assert set(sizes) == {p.qualname for p in PIECES[m]} and min(sizes.values()) >= 1, m
        assert sum(n - 1 for n in sizes.values()) == removed, m


def test_a_piece_with_only_a_docstring_or_an_unknown_module_is_refused_in_words():
    from tl_lab.exercise.stubs import _body_span, check_module

    fn = ast.parse('def f():\n    """Only this."""\n').body[0]
    with pytest.raises(ExerciseError, match=r"^f has only a docstring: nothing to blank$"):
        _body_span(fn)
    with pytest.raises(ExerciseError, match=r"^unknown module 'kvs': the learner's modules are "
                                            r"kv, quant, model, forward, runner, sample$"):
        check_module("kvs")


def test_a_parametrized_id_is_graded_by_its_function_whatever_its_parameters_say():
    plain = registry.match("tests/test_kv.py::test_kv_pool_rejects_zero_capacity")
    assert plain is not None and plain.name == "kv_pool_rejects_zero_capacity"
    for params in ("[a[0]]", "[x::y]", "[0-[1]]"):
        assert registry.match(f"tests/test_kv.py::test_kv_pool_rejects_zero_capacity{params}") == plain, params
    assert registry.match("tests/test_kv.py::test_kv_pool_rejects_zero_capacity_too_late") == plain  # a variant
    assert registry.match("tests/test_sample.py::test_kv_pool_rejects_zero_capacity") is None  # another file


@pytest.mark.parametrize("value, where", [("off", "default"), (" OFF ", "default"), ("", "default"),
                                          ("0", "default"), ("none", "default"), ("{tmp}/ws", "{tmp}/ws")])
def test_the_workspace_is_the_one_named_else_the_clones(tmp_path, monkeypatch, value, where):
    from tl_lab.exercise import workspace as wsm

    monkeypatch.setenv(wsm.ENV, value.format(tmp=tmp_path))
    expected = wsm.default_workspace() if where == "default" else tmp_path / "ws"
    assert wsm.resolve() == expected
    assert wsm.resolve(tmp_path / "given") == tmp_path / "given"  # an argument wins over the environment
    monkeypatch.delenv(wsm.ENV)
    assert wsm.resolve() == wsm.default_workspace()


def test_the_workspace_is_the_one_the_readme_names_and_git_ignores():
    """The default workspace is work/L10.1 in the clone, as the README tells the learner, and git
    ignores it (pulling an update never touches the learner's files)."""
    from tl_lab.exercise import workspace as wsm

    where = wsm.default_workspace().relative_to(REPO_ROOT).as_posix()
    assert where == "work/L10.1" and f"`{where}/`" in (REPO_ROOT / "README.md").read_text()
    assert "/work/" in (REPO_ROOT / ".gitignore").read_text().split(), ".gitignore does not name /work/"


def test_the_workspace_is_the_one_whose_refusal_is_kept_and_lifted_alone(monkeypatch):
    """A bad TL_LAB_WORKSPACE kept by `import tl_lab` (a RefusingFinder with an ExerciseError) is what
    `env_error` reports, and `lift_refusal` removes it, and only it: a bad TL_LAB_PITFALL's stays."""
    from tl_lab.exercise import workspace as wsm
    from tl_lab.pitfalls import PitfallError
    from tl_lab.switch import RefusingFinder

    ours = RefusingFinder(ExerciseError("TL_LAB_WORKSPACE: no such folder"), lambda name: False)
    theirs = RefusingFinder(PitfallError("TL_LAB_PITFALL: s99 is not a pitfall"), lambda name: False)
    monkeypatch.setattr(sys, "meta_path", [theirs, ours, ours, *sys.meta_path])
    assert wsm.env_error() is ours.error
    wsm.lift_refusal()
    assert ours not in sys.meta_path and theirs in sys.meta_path
    assert wsm.env_error() is None


def _hook_workspace(tmp_path):
    """A workspace of three kinds of file: kv.py the untouched stub, quant.py the learner's (here the
    reference's text), model.py absent, the rest stubs."""
    ws = tmp_path / "ws"
    ws.mkdir()
    for m in MODULES:
        if m != "model":
            (ws / f"{m}.py").write_text(reference_source(m) if m == "quant" else stub_source(m), encoding="utf-8")
    return ws


def test_in_process_hook_plans_each_modules_origin(tmp_path):
    from tl_lab.exercise import workspace as wsm

    ws = _hook_workspace(tmp_path)
    got = wsm.plan(ws)
    assert (got["quant"].origin, got["quant"].file, got["quant"].why) == ("learner", str(ws / "quant.py"),
                                                                         "the learner's file")
    assert (got["kv"].origin, got["kv"].why) == ("reference", "untouched since start (the stub)")
    assert (got["model"].origin, got["model"].why) == ("reference", "no model.py in the workspace")
    assert got["model"].file == str(wsm.reference_path("model")) == got["kv"].file.replace("kv.py", "model.py")
    asked = wsm.plan(ws, use={"kv"})  # asked for by name: the stub is the learner's now
    assert asked["kv"].origin == "learner" and asked["quant"].why == "the reference stands in (not asked for)"
    instead = wsm.plan(ws, instead={"quant": "its tests fail"})
    assert (instead["quant"].origin, instead["quant"].why) == ("reference", "its tests fail")
    finder = wsm.WorkspaceFinder(ws, got)
    assert set(finder.served) == {"tl_lab.quant"} and finder.served["tl_lab.quant"][1] == reference_source("quant")
    assert finder.workspace == ws and finder.origins is got


def test_in_process_hook_installs_once_first_on_the_path(tmp_path, monkeypatch):
    from tl_lab.exercise import workspace as wsm

    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    ws = _hook_workspace(tmp_path)
    import tl_lab.quant  # noqa: F401  (the reference, already imported here)

    with pytest.raises(ExerciseError, match=r"^tl_lab\.quant already imported from the reference: activate"):
        wsm.install(ws)
    assert wsm.active() is None  # refused whole: nothing installed
    finder = wsm.install(ws, use=set())  # nothing from the learner: the modules already imported do not matter
    assert sys.meta_path[0] is finder and wsm.active() is finder
    assert {o.origin for o in finder.origins.values()} == {"reference"}
    assert wsm.install(str(ws), use=set()) is finder  # the same workspace again: the same hook
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(ExerciseError, match=f"workspace {ws} is already active in this process"):
        wsm.install(other, use=set())


@pytest.mark.parametrize("value", ["off", "", " NONE ", None])  # None: unset
def test_in_process_hook_from_the_environment_off_installs_nothing(monkeypatch, value):
    from tl_lab.exercise import workspace as wsm

    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    if value is None:
        monkeypatch.delenv(wsm.ENV, raising=False)
    else:
        monkeypatch.setenv(wsm.ENV, value)
    assert wsm.install_from_env() is None and wsm.active() is None


def test_in_process_hook_from_the_environment_takes_the_modules_named(tmp_path, monkeypatch):
    from tl_lab.exercise import workspace as wsm

    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    ws = _hook_workspace(tmp_path)
    import tl_lab.kv  # noqa: F401  (the reference, imported here whatever ran before)
    import tl_lab.quant  # noqa: F401

    monkeypatch.setenv(wsm.ENV, str(ws))
    monkeypatch.setenv(wsm.ENV_USE, " , ")  # no module named: the reference for all six
    finder = wsm.install_from_env()
    assert finder.workspace == ws and {o.origin for o in finder.origins.values()} == {"reference"}
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if f is not finder])
    monkeypatch.setenv(wsm.ENV_USE, "kv, quant")
    with pytest.raises(ExerciseError, match="already imported from the reference"):  # both named, both imported
        wsm.install_from_env()
    monkeypatch.delenv(wsm.ENV_USE)
    with pytest.raises(ExerciseError, match=r"^tl_lab\.\w+(, tl_lab\.\w+)* already imported"):  # quant differs
        wsm.install_from_env()


def test_in_process_hook_refuses_the_six_after_a_bad_environment(monkeypatch):
    from tl_lab.exercise import workspace as wsm

    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.setenv(wsm.ENV, "/no/such/folder")
    wsm.refuse_from_env(ExerciseError("workspace /no/such/folder does not exist"))
    finder = sys.meta_path[0]
    assert wsm.env_error() is finder.error
    assert str(finder.error) == "TL_LAB_WORKSPACE=/no/such/folder: workspace /no/such/folder does not exist"
    for module in MODULES:
        with pytest.raises(ExerciseError, match="^TL_LAB_WORKSPACE=/no/such/folder: "):
            finder.find_spec(f"tl_lab.{module}")
    for other in ("tl_lab.lanes", "tl_lab", "kv", "tl_lab.kv_extra", "tl_lab.widgets.kv"):
        assert finder.find_spec(other) is None, other


def test_origins_say_which_file_each_loaded_module_came_from():
    import tl_lab.kv
    from tl_lab.exercise import workspace as wsm

    got = wsm.origins()
    assert set(got) == set(MODULES) and got["kv"]["loaded"] == tl_lab.kv.__file__
    assert all(o["origin"] == "reference" and o["why"] == "no workspace active" for o in got.values())


def test_the_tests_command_lists_the_catalogue_row_by_row(tmp_path, capsys):
    """`exercise tests`: each chapter test with its kind, module, our test, what it checks and why."""
    from tl_lab.__main__ import main

    assert main(["exercise", "tests", "--workspace", str(tmp_path)]) == 0  # a workspace with no results yet
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["chapter", "test", "kind", "module", "last", "our", "test"]
    assert lines[-1] == "24 tests; you write no graded tests here (rung R0)"
    rows = [i for i, line in enumerate(lines) if line and not line.startswith(" ")][1:-1]
    assert len(rows) == len(CATALOGUE)
    for i, g in zip(rows, CATALOGUE):
        assert lines[i].split() == [g.name, *g.kind.split(), g.module, "-", f"{g.file}::test_{g.name}*"]
        assert lines[i + 1].strip() == f"checks: {g.checks}" and lines[i + 2].strip() == f"why: {g.why}"
        assert (lines[i + 3].strip() == f"with: {', '.join(g.also)}") == bool(g.also)


class _Off:
    """The reference sample module with one thing changed: `name` replaced by `value`."""

    def __init__(self, **changed):
        import tl_lab.sample as ts

        self._ts, self._changed = ts, changed

    def __getattr__(self, name):
        return self._changed.get(name, getattr(self._ts, name))


def test_in_process_parity_of_the_reference_is_every_case():
    from tl_lab.exercise import parity
    from tl_lab import sample as ts

    got = parity.run(ts, ["sampler", "rng"])
    assert [(v.suite, v.ok, v.first_difference) for v in got] == [("sampler", True, ""), ("rng", True, "")]
    assert got[0].matched == got[0].total == 12 and got[1].matched == got[1].total > 12
    assert got[0].line() == "parity sampler: 12/12 cases identical"


def test_in_process_parity_names_the_first_output_that_differs():
    from tl_lab.exercise import parity
    from tl_lab import sample as ts

    class Pcg32(ts.Pcg32):
        outputs = None  # None while seeding: its own calls are not outputs

        def __init__(self, *args):
            super().__init__(*args)
            self.outputs = 0

        def next_u32(self):
            if self.outputs is None:
                return super().next_u32()
            self.outputs += 1
            return super().next_u32() ^ (1 if self.outputs == 3 else 0)  # every generator's third output

    v = parity.parity_rng(_Off(Pcg32=Pcg32))
    assert not v.ok and v.matched == 0 and v.total == parity.parity_rng(ts).total
    assert v.first_difference.startswith("next_u32 seed ") and v.first_difference.endswith("(output 2)")
    yours, golden = v.first_difference.split(": yours ")[1].split(" (output")[0].split(", golden ")
    assert int(yours, 16) ^ int(golden, 16) == 1
    assert v.line() == f"parity rng: 0/{v.total} cases identical\n  first difference: {v.first_difference}"

    def mix64(x):
        raise ValueError("not written yet")

    v = parity.parity_rng(_Off(mix64=mix64))
    n_before = sum(1 for line in v.first_difference.splitlines())  # one line
    assert v.first_difference.startswith("mix64(") and v.first_difference.endswith(
        ": raised ValueError: not written yet") and n_before == 1
    assert 0 < v.matched < v.total  # the PCG32 cases before mix64's matched
    assert parity._first_diff(5, 7) == "5, golden 7" and parity._first_diff([1], [1, 2]) == "[1], golden [1, 2]"


def test_in_process_parity_of_the_sampler_is_bit_for_bit():
    from tl_lab.exercise import parity
    from tl_lab import sample as ts

    def one_ulp_off(*args):
        tok, lp = ts.sample(*args)
        return tok, float(np.nextafter(lp, -np.inf))

    v = parity.parity_sampler(_Off(sample=one_ulp_off))
    assert not v.ok and v.matched == 0 and v.total == 12
    assert v.first_difference.startswith("case ") and " token 0: yours id " in v.first_difference
    yours, golden = (float.fromhex(part.split(" logprob ")[1].split(" ")[0])
                     for part in v.first_difference.split(", golden "))
    assert yours == np.nextafter(golden, -np.inf)

    def raising(*args):
        raise NotImplementedError("section 2.6")

    v = parity.parity_sampler(_Off(sample=raising))
    assert v.first_difference.endswith("token 0: raised NotImplementedError: section 2.6") and v.matched == 0
    assert v.total == 12


def _report(results=(), errors=(), loaded=None, module="kv"):
    """A report as the plugin writes it (tl_lab.exercise.plugin): results, errors and origins."""
    return {"results": list(results), "errors": list(errors), "origins": {module: {"loaded": loaded}}}


def _result(name, outcome="passed", message="", params=""):
    return {"nodeid": f"tests/test_kv.py::test_{name}{params}", "chapter_test": name, "outcome": outcome,
            "message": message}


def test_in_process_grading_orders_the_modules_with_their_dependencies():
    from tl_lab.exercise.grading import order

    assert order() == list(MODULES) and order([]) == list(MODULES)
    assert order(["forward"]) == ["kv", "quant", "model", "forward"]  # the chapter's order, not the asked one
    assert order(["sample", "model"]) == ["quant", "model", "sample"]
    with pytest.raises(ExerciseError):
        order(["kvv"])


def test_in_process_grading_reads_a_report_into_the_modules_row(tmp_path):
    from tl_lab.exercise.grading import MESSAGE_LINES, MESSAGE_WIDTH, _row

    f, log, uses = tmp_path / "kv.py", tmp_path / "check-kv.log", {"kv": "learner"}
    names = [g.name for g in graded("kv")]
    row = _row("kv", f, uses, None, log, 1.04, 120)
    assert (row.state, row.message, row.seconds, row.log) == ("not run", f"pytest wrote no report; see {log}", 1.0,
                                                              str(log))
    row = _row("kv", f, uses, _report(errors=[{"kind": "origin", "message": "tl_lab.kv is the reference"}]), log, 1, 120)
    assert (row.state, row.message) == ("origin error", "tl_lab.kv is the reference") and "nothing was graded" in row.hint
    row = _row("kv", f, uses, _report(loaded="/elsewhere/kv.py"), log, 1, 120)
    assert (row.state, row.message) == ("origin error", f"tl_lab.kv ran from /elsewhere/kv.py, not {f}")
    text = f"{f}:3: in <module>\n    import x\n{f}:12: in f\nE   NameError: name 'x' is not defined\n\n"
    row = _row("kv", f, uses, _report(errors=[{"kind": "collect", "message": text}], loaded=str(f)), log, 1, 120)
    assert (row.state, row.message) == ("does not import", f"{f}:12: E   NameError: name 'x' is not defined")
    row = _row("kv", f, uses, _report(errors=[{"kind": "collect", "message": "E   boom\n" * 9}]), log, 1, 120)
    assert row.message == "\n".join(["E   boom"] * MESSAGE_LINES)  # no line of the file named: the first lines
    passing = [_result(n) for n in names] + [_result(names[0], params="[1]")]
    row = _row("kv", f, uses, _report(passing, loaded=str(f)), log, 1, 120)
    assert (row.state, row.passed, row.total, row.ok) == ("passed", 4, 4, True)
    assert row.results == dict.fromkeys(names, "passed")
    row = _row("kv", f, uses, _report(passing[1:-1]), log, 1, 120)
    assert (row.state, row.message) == ("failed", f"only 3 of the 4 chapter tests ran; see {log}")
    long = "AssertionError: " + "x" * 300 + "\nline 2"
    failing = [_result(names[0]), _result(names[1], "failed", long), _result(names[2], "failed", "second")]
    row = _row("kv", f, uses, _report(failing + [_result(names[0], "failed", params="[2]")]), log, 1, 120)
    assert (row.state, row.passed, row.total, row.first_failure) == ("failed", 0, 3, names[1])
    assert row.results == {names[0]: "failed", names[1]: "failed", names[2]: "failed"}  # a node failing fails its test
    first, second = row.message.splitlines()
    assert first == f"test_{names[1]}: " + long[:MESSAGE_WIDTH] and second == "line 2"
    assert row.hint == pitfall_hint("kv", failing[1]["nodeid"], long, 120)
    assert row.hint.startswith("this is what s18 looks like: evicting the newest prefix instead of the oldest")


def test_in_process_grading_hints_in_the_chapters_words():
    from tl_lab.exercise.grading import pitfall_hint
    from tl_lab.exercise.stubs import NOT_WRITTEN

    msg = f"NotImplementedError: KvPool.alloc: {NOT_WRITTEN} (section 2.2: hand out free blocks)"
    assert pitfall_hint("kv", "tests/test_kv.py::test_x", msg) == (
        "KvPool.alloc is not written yet: reread section 2.2 (hand out free blocks)")
    assert pitfall_hint("kv", "tests/test_kv.py::test_slow[3]", "TestTimeout: ...", timeout=2.5) == (
        "test_slow[3] ran past the 2.5 s limit: a loop that never ends?")
    assert "ran past the 120 s limit" in pitfall_hint("kv", "t.py::test_y", "it ran longer than allowed")
    where = f"reread {registry.SECTIONS['kv']}"
    assert pitfall_hint("kv", "tests/test_kv.py::test_kv_pool_rejects_zero_capacity[0]", "AssertionError") == (
        f"this is what s19 looks like: accepting a zero-block pool; {where}")
    assert pitfall_hint("kv", "tests/test_kv.py::test_kv_pool_rejects_zero_capacity_too", "x").startswith(
        "this is what s19 looks like")  # a variant of the pitfall's test
    assert pitfall_hint("kv", "tests/test_kv.py::test_something_else", "AssertionError") == where
    assert pitfall_hint("sample", "tests/test_kv.py::test_kv_pool_rejects_zero_capacity", "x") == (
        f"reread {registry.SECTIONS['sample']}")  # s19 edits kv, not sample


def test_in_process_grading_of_a_workspace_not_started_saves_every_row(tmp_path):
    from tl_lab.exercise.grading import STATUS_DIR, check, format_table, load_status

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "quant.py").write_text(stub_source("quant"), encoding="utf-8")
    (ws / "sample.py").write_text("def sample(:\n", encoding="utf-8")
    seen = []
    rows = check(ws, progress=seen.append)
    assert [r.module for r in rows] == list(MODULES) and seen == rows
    states = {r.module: r.state for r in rows}
    assert states == {"kv": "not started", "quant": "not started", "model": "not started",
                      "forward": "not started", "runner": "not started", "sample": "does not import"}
    by = {r.module: r for r in rows}
    assert by["kv"].hint == "no kv.py yet: python -m tl_lab exercise start kv"
    assert by["quant"].hint.startswith("quant.py is the stub: write its pieces (sections 2.5")
    assert by["sample"].message.startswith(f"{ws / 'sample.py'}:1: SyntaxError: ")
    status = load_status(ws)
    assert set(status) == set(MODULES) and status["sample"]["state"] == "does not import" and status["kv"]["when"]
    assert sorted(p.name for p in (ws / STATUS_DIR).iterdir()) == ["status.json"]  # no temporary left
    table = format_table(rows).splitlines()
    assert table[0].split() == ["module", "state", "tests", "from"] and table[-1] == "0 of 6 modules pass"
    assert "kv       not started          -  -" in table
    (ws / STATUS_DIR / "status.json").write_text("{not json", encoding="utf-8")
    assert load_status(ws) == {}


def test_in_process_grading_table_says_where_each_module_came_from():
    from tl_lab.exercise.grading import Row, format_table

    rows = [Row("kv", "passed", "kv.py", {"kv": "learner"}, passed=4, total=4),
            Row("model", "failed", "model.py", {"model": "learner", "quant": "reference (--ref-deps)"}, passed=1,
                total=2, first_failure="model_loads", message="AssertionError\nline 2", hint="reread it")]
    assert format_table(rows).splitlines()[2:] == [
        "kv       passed             4/4  learner's file",
        "model    failed             1/2  learner's file; quant: reference (--ref-deps)",
        "         first failing: model_loads",
        "         AssertionError",
        "         line 2",
        "         hint: reread it",
        "1 of 2 modules pass"]


def test_in_process_grading_needs_the_clones_tests(tmp_path, monkeypatch):
    from tl_lab.exercise import grading

    grading.need_tests(MODULES)  # the clone has them
    monkeypatch.setattr(grading, "REPO_ROOT", tmp_path)
    with pytest.raises(ExerciseError, match=r"^exercise check runs the chapter's tests from a clone .* has no "
                                            r"tests/conftest\.py: clone it"):
        grading.need_tests(["kv"])


def _raised_in(ws, module, source, call="f()"):
    """The exception `source` (compiled as the workspace's `module`.py) raises at `call`."""
    path = ws / f"{module}.py"
    path.write_text(source, encoding="utf-8")
    scope = {}
    try:
        exec(compile(source, str(path), "exec"), scope)
        eval(call, scope)
    except BaseException as exc:  # noqa: BLE001
        return exc
    raise AssertionError("did not raise")


def test_in_process_guard_blames_the_learners_innermost_frame(tmp_path):
    from tl_lab.exercise import guard

    piece = registry.PIECES["kv"][0]
    owner, _, name = piece.qualname.rpartition(".")
    source = (f"class {owner}:\n    def {name}(self):\n        return 1 / 0\n" if owner else
              f"def {name}():\n    return 1 / 0\n")
    exc = _raised_in(tmp_path, "kv", source, f"{owner}().{name}()" if owner else f"{name}()")
    fault = guard.blame(exc, tmp_path, "runner")  # tried through the runner, raised in kv.py
    assert (fault.module, fault.file, fault.line, fault.function) == ("kv", str(tmp_path / "kv.py"), 3 if owner else 2,
                                                                       piece.qualname)
    assert fault.error == "ZeroDivisionError: division by zero"
    assert fault.hint == f"{piece.hint} (section {piece.section}); python -m tl_lab exercise hint kv"
    assert fault.at == f"{tmp_path / 'kv.py'}:{fault.line}"
    assert fault.lines() == [
        "!! your kv.py raises, so this notebook runs the reference's kv in its place:",
        f"   {fault.at} in {piece.qualname}: ZeroDivisionError: division by zero",
        f"   hint: {fault.hint}",
        "   fix it (python -m tl_lab exercise check kv says more), then restart the kernel"]


def test_in_process_guard_blames_imports_syntax_stubs_and_long_errors(tmp_path):
    from tl_lab.exercise import guard
    from tl_lab.exercise.stubs import NOT_WRITTEN

    exc = _raised_in(tmp_path, "sample", "x = undefined_name\n", "0")
    fault = guard.blame(exc, tmp_path, "sample")
    assert (fault.module, fault.line, fault.function) == ("sample", 1, "(import)")
    assert fault.hint == f"reread {registry.SECTIONS['sample']}; python -m tl_lab exercise hint sample"
    try:
        compile("def f(:\n", str(tmp_path / "quant.py"), "exec")
    except SyntaxError as exc:
        fault = guard.blame(exc, tmp_path, "runner")
    assert (fault.module, fault.file, fault.line, fault.function) == ("quant", str(tmp_path / "quant.py"), 1, "(import)")
    exc = _raised_in(tmp_path, "model", f"def f():\n    raise NotImplementedError('load: {NOT_WRITTEN} (section 2.3)')\n")
    fault = guard.blame(exc, tmp_path, "model")
    assert fault.hint == "a piece still the stub (its message says what to write); python -m tl_lab exercise hint model"
    exc = _raised_in(tmp_path, "kv", "def f():\n    raise ValueError('v' * 400)\n")
    fault = guard.blame(exc, tmp_path, "kv")
    assert fault.error == ("ValueError: " + "v" * 400)[: guard.MESSAGE_CHARS] + " ..."
    fault = guard.blame(ValueError("no traceback"), tmp_path, "runner")  # no frame of the learner's
    assert (fault.module, fault.file, fault.line, fault.at, fault.function) == (
        "runner", str(tmp_path / "runner.py"), None, str(tmp_path / "runner.py"), "(import)")


def test_in_process_guard_tries_each_module_once_without_the_ones_that_raised(tmp_path, monkeypatch):
    from tl_lab.exercise import guard

    def fault(m):
        return guard.Fault(m, f"{m}.py", 1, "f", "E: e", "h")

    calls, verdicts = [], [fault("kv"), fault("elsewhere"), None]
    monkeypatch.setattr(guard, "_one_trial", lambda ws, left: calls.append(list(left)) or verdicts.pop(0))
    got = guard.trial(tmp_path, ["runner", "kv", "sample", "model"])
    assert calls == [["kv", "model", "runner", "sample"], ["model", "runner", "sample"], ["runner", "sample"]]
    assert list(got) == ["kv", "model"] and got["model"].file == "elsewhere.py"  # not one of ours: the first left
    assert guard._last_tried("x\ntrying kv\nprint\ntrying quant\n", ["kv", "quant"]) == "quant"
    assert guard._last_tried("trying model\n", ["kv", "quant"]) == "kv"  # not asked: the first
    assert guard._last_tried("", ["sample"]) == "sample"
    assert guard._last_tried("trying kv\ntrying quant\ntrying model\n", ["kv", "quant", "model"]) == "model"


def test_in_process_guard_trial_process_prints_its_verdict_last(tmp_path, monkeypatch, capsys):
    import json

    from tl_lab.exercise import guard

    assert guard._main([str(tmp_path), "sample", *reversed(MODULES)]) == 0  # the reference: every trial runs
    out = capsys.readouterr().out.splitlines()
    assert out == [f"trying {m}" for m in MODULES] + [guard.MARK + "null"]  # the chapter's order, each once

    def boom():
        raise RuntimeError("at call")

    monkeypatch.setitem(guard.TRIALS, "quant", boom)
    guard._main([str(tmp_path), "quant", "sample"])
    out = capsys.readouterr().out.splitlines()
    assert out[:1] == ["trying quant"] and out[-1].startswith(guard.MARK)  # stopped at the first fault
    verdict = json.loads(out[-1][len(guard.MARK):])
    assert (verdict["module"], verdict["error"]) == ("quant", "RuntimeError: at call") and len(out) == 2


def _in_process_cli(capsys, *argv):
    """`python -m tl_lab exercise ARGV` run in this process -> (exit code, stdout, stderr)."""
    import argparse

    from tl_lab.exercise.cli import add_cli

    parser = argparse.ArgumentParser(prog="tl_lab")
    add_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["exercise", *argv])
    code = args.run(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_in_process_cli_start_status_hint_reset_and_check(tmp_path, capsys):
    ws = tmp_path / "ws"
    code, out, _ = _in_process_cli(capsys, "start", "kv", "sample", "--workspace", str(ws))
    assert code == 0 and out.splitlines()[:2] == [f"{'wrote':<24} {ws / 'kv.py'}", f"{'wrote':<24} {ws / 'sample.py'}"]
    assert out.splitlines()[-1].startswith("next: python -m tl_lab exercise tests")
    assert sorted(p.name for p in ws.iterdir()) == ["kv.py", "sample.py"]
    code, out, _ = _in_process_cli(capsys, "start", "kv", "--workspace", str(ws))
    assert out.splitlines()[0] == f"{'left alone (it exists)':<24} {ws / 'kv.py'}"
    (ws / "quant.py").write_text(reference_source("quant"), encoding="utf-8")
    code, out, _ = _in_process_cli(capsys, "status", "--workspace", str(ws))
    lines = out.splitlines()
    n_kv, n_quant = len(registry.PIECES["kv"]), len(registry.PIECES["quant"])
    assert code == 0 and lines[0] == f"workspace {ws}"
    assert lines[1] == f"  kv       the stub   0/{n_kv:<2} pieces  last check: never checked"
    assert lines[2] == f"  quant    yours     {n_quant:>2}/{n_quant:<2} pieces  last check: never checked"
    assert lines[3].startswith("  model    no file    0/")
    code, out, _ = _in_process_cli(capsys, "hint", "kv", "--workspace", str(ws))
    lines = out.splitlines()
    assert lines[0] == f"kv: {registry.SECTIONS['kv']}; 0 of {n_kv} pieces written"
    first = registry.PIECES["kv"][0]
    assert lines[1].startswith(f"  [todo] {first.qualname:<28} section {first.section:<4} ~") and first.hint in lines[1]
    code, out, err = _in_process_cli(capsys, "check", "kv", "--workspace", str(ws))  # the stub: no test run
    assert code == 1 and "kv       not started" in out and out.splitlines()[-1] == "0 of 1 modules pass"
    assert err.split() == ["kv", "not", "started", "0.0", "s"]
    code, out, _ = _in_process_cli(capsys, "hint", "kv", "--workspace", str(ws))
    assert out.splitlines()[-1].startswith("last check (") and "): not started; kv.py is the stub" in out
    code, out, _ = _in_process_cli(capsys, "status", "--workspace", str(ws))
    assert "last check: not started 0/0 (" in out.splitlines()[1]
    (ws / "kv.py").write_text("# mine\n", encoding="utf-8")
    code, out, _ = _in_process_cli(capsys, "reset", "kv", "--workspace", str(ws))
    backup = next(ws.glob("kv.py.bak-*"))
    assert code == 0 and out.splitlines() == [f"kept your file as {backup}", f"wrote a fresh stub {ws / 'kv.py'}"]
    assert backup.read_text() == "# mine\n" and (ws / "kv.py").read_text() == stub_source("kv")
    code, out, _ = _in_process_cli(capsys, "reset", "model", "--workspace", str(ws))
    assert out.splitlines()[0] == "there was no model.py"


def test_in_process_cli_refuses_in_one_line(tmp_path, capsys):
    ws = tmp_path / "ws"
    code, out, err = _in_process_cli(capsys, "status", "--workspace", str(ws))
    assert (code, out) == (2, "") and err == f"error: workspace {ws} does not exist: python -m tl_lab exercise start writes it\n"
    ws.mkdir()
    code, _, err = _in_process_cli(capsys, "parity", "dice", "--workspace", str(ws))
    assert code == 2 and err == "error: unknown parity suite 'dice': the suites are sampler, rng\n"
    code, _, err = _in_process_cli(capsys, "parity", "--workspace", str(ws))
    assert code == 2 and err == f"error: no {ws / 'sample.py'}: python -m tl_lab exercise start sample\n"
    (ws / "sample.py").write_text(stub_source("sample"), encoding="utf-8")
    import tl_lab.sample  # noqa: F401

    code, _, err = _in_process_cli(capsys, "parity", "--workspace", str(ws))
    assert code == 2 and err == "error: tl_lab.sample is already imported in this process: run parity in a fresh one\n"
    code, _, err = _in_process_cli(capsys, "hint", "kvv", "--workspace", str(ws))
    assert code == 2 and err.startswith("error: ") and "kvv" in err and len(err.splitlines()) == 1


def test_in_process_cli_tests_lists_the_last_results(tmp_path, capsys):
    from tl_lab.exercise.grading import Row, _save

    ws = tmp_path / "ws"
    ws.mkdir()
    first = next(g for g in CATALOGUE if g.module == "kv")
    _save(ws, [Row("kv", "failed", "kv.py", results={first.name: "failed"})])
    code, out, _ = _in_process_cli(capsys, "tests", "--workspace", str(ws))
    assert code == 0 and out.splitlines()[-1] == f"{len(CATALOGUE)} tests; you write no graded tests here (rung R0)"
    lines = out.splitlines()
    for g in CATALOGUE:
        head = f"{g.name:<46} {g.kind:<20} {g.module:<8} "
        row = next(line for line in lines if line.startswith(head))
        assert row[len(head):].split()[0] == ("failed" if g == first else "-"), g.name


def test_in_process_grading_of_a_row_names_each_test_and_passes_the_limit(tmp_path):
    from tl_lab.exercise.grading import _row, pitfall_hint
    from tl_lab.pitfalls import PITFALLS

    f, log = tmp_path / "kv.py", tmp_path / "check-kv.log"
    unnamed = {"nodeid": "tests/test_kv.py::test_helper", "chapter_test": None, "outcome": "failed",
               "message": "TestTimeout: ran longer than 2.5 s"}
    row = _row("kv", f, {"kv": "learner"}, _report([unnamed]), log, 1, 2.5)
    assert row.results == {"tests/test_kv.py::test_helper": "failed"} and row.uses == {"kv": "learner"}
    assert row.first_failure == "tests/test_kv.py::test_helper" and "ran past the 2.5 s limit" in row.hint
    text = "E   ImportError: nope"
    row = _row("kv", f, {}, _report(errors=[{"kind": "collect", "message": text}]), log, 1, 120)
    assert row.hint == "the module fails when imported; the other modules are still checked"
    both = sorted(p.id for p in PITFALLS.values() if p.test.endswith("::test_penalties_follow_hf_and_openai_semantics"))
    hint = pitfall_hint("sample", "tests/test_sample.py::test_penalties_follow_hf_and_openai_semantics", "x")
    mistakes = [PITFALLS[i].mistake for i in both]
    assert hint.startswith(f"this is what {' or '.join(both)} looks like: "
                           f"{mistakes[0][0].lower()}{mistakes[0][1:]}; {mistakes[1][0].lower()}{mistakes[1][1:]}; reread")


def test_in_process_grading_blocks_a_module_whose_dependencies_do_not_pass(tmp_path, monkeypatch):
    from tl_lab.exercise import grading

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "forward.py").write_text(reference_source("forward"), encoding="utf-8")
    (ws / "kv.py").write_text(reference_source("kv"), encoding="utf-8")
    ran = []

    def run(workspace, module, use, timeout, tests=None, first_failure=False):
        ran.append((module, use))
        passing = [{"nodeid": f"x::test_{g.name}", "chapter_test": g.name, "outcome": "passed", "message": ""}
                   for g in graded(module)]
        return _report(passing, module=module, loaded=str(workspace / f"{module}.py")), workspace / "log", 0.5

    monkeypatch.setattr(grading, "_run", run)  # the pytest subprocess, as its report
    rows = {r.module: r for r in grading.check(ws, ["forward"])}
    assert ran == [("kv", ["kv"])] and rows["kv"].ok and rows["kv"].uses == {"kv": "learner"}
    fw = rows["forward"]
    assert (fw.state, fw.message) == ("blocked", "blocked by quant, model (not passing)")
    assert fw.uses == {"forward": "learner", "quant": "blocked", "kv": "learner", "model": "blocked",
                       "runner": "reference (harness)"}
    assert fw.hint == "pass quant, model first, or check with --ref-deps to borrow the reference"
    rows = {r.module: r for r in grading.check(ws, ["forward"], ref_deps=True)}
    assert ran[-1] == ("forward", ["forward", "kv"]) and rows["forward"].ok
    assert rows["forward"].uses == {"forward": "learner", "quant": "reference (--ref-deps)", "kv": "learner",
                                    "model": "reference (--ref-deps)", "runner": "reference (harness)"}


def test_in_process_cli_parity_runs_the_learners_sample(tmp_path, capsys, monkeypatch):
    """`exercise parity` in a process where tl_lab.sample is not imported yet: the workspace's
    sample.py is the one held to the golden files, and one that does not import is named at its line."""
    import tl_lab

    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.setattr(tl_lab, "sample", tl_lab.sample, raising=False)
    monkeypatch.delitem(sys.modules, "tl_lab.sample")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "sample.py").write_text(reference_source("sample"), encoding="utf-8")
    code, out, _ = _in_process_cli(capsys, "parity", "rng", "rng", "--workspace", str(ws))
    assert code == 0 and out.splitlines()[0] == (f"your {ws / 'sample.py'} against data/golden/sampler.json, "
                                                 "data/golden/pcg32.vectors.json")
    assert len(out.splitlines()) == 2 and out.splitlines()[1].startswith("parity rng: ")  # the suite once
    assert sys.modules["tl_lab.sample"].__file__ == str(ws / "sample.py")

    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if type(f).__name__ != "WorkspaceFinder"])
    monkeypatch.delitem(sys.modules, "tl_lab.sample")
    other = tmp_path / "broken"
    other.mkdir()
    (other / "sample.py").write_text("import numpy\n\nx = undefined_name\n", encoding="utf-8")
    code, out, _ = _in_process_cli(capsys, "parity", "--workspace", str(other))
    assert code == 1 and out == f"parity: {other / 'sample.py'}:3: NameError: name 'undefined_name' is not defined\n"


def test_in_process_cli_knows_which_commands_need_the_workspace(tmp_path, capsys, monkeypatch):
    from tl_lab.exercise import cli as cli_module, workspace as wsm

    missing = tmp_path / "not-yet"
    monkeypatch.delenv(wsm.ENV, raising=False)
    monkeypatch.setattr(cli_module, "resolve", lambda given: missing if given is None else wsm.resolve(given))
    assert _in_process_cli(capsys, "tests")[0] == 0  # the catalogue, before start
    assert _in_process_cli(capsys, "hint", "kv")[0] == 0
    code, _, err = _in_process_cli(capsys, "status")  # needs the workspace, even the default one
    assert code == 2 and err == f"error: workspace {missing} does not exist: python -m tl_lab exercise start writes it\n"
    code, _, err = _in_process_cli(capsys, "tests", "--workspace", str(missing))  # a named one must exist
    assert code == 2 and "does not exist" in err


def test_in_process_cli_workspace_option_lifts_a_bad_environment(tmp_path, capsys, monkeypatch):
    from tl_lab.exercise import workspace as wsm

    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    wsm.refuse_from_env(ExerciseError("no such folder"))
    _in_process_cli(capsys, "tests")
    assert wsm.env_error() is not None  # no --workspace: the refusal stays for the command line to report
    _in_process_cli(capsys, "tests", "--workspace", str(tmp_path))
    assert wsm.env_error() is None


def test_in_process_cli_help_names_every_command_and_argument(capsys):
    import argparse

    from tl_lab.exercise.cli import COMMANDS, add_cli

    parser = argparse.ArgumentParser(prog="tl_lab")
    add_cli(parser.add_subparsers(dest="command"))
    with pytest.raises(SystemExit):
        parser.parse_args(["exercise", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "your turn: write the six modules, the chapter's tests grade them" in text or "Chapter L10.1" in text
    for name in COMMANDS:
        assert f" {name} " in text, name
    assert "run the graded tests on your code; exit 0 only when every one asked for passes" in text
    with pytest.raises(SystemExit):
        parser.parse_args(["exercise", "parity", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "[SUITE ...]" in text and "--workspace DIR" in text and "else work/L10.1" in text
    with pytest.raises(SystemExit):
        parser.parse_args(["exercise", "check", "--help"])
    assert "--timeout S" in " ".join(capsys.readouterr().out.split())
    assert parser.parse_args(["exercise", "parity"]).suites == ["sampler", "rng"]
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    assert "your turn: write the six modules, the chapter's tests grade them" in " ".join(capsys.readouterr().out.split())


def test_in_process_side_loads_yours_beside_the_reference(tmp_path, capsys):
    from tl_lab.exercise import side

    ws = tmp_path / "tl_lab" / "work" / "L10.1"  # a clone is often a folder named tl_lab
    ws.mkdir(parents=True)
    assert side.yours("sample", ws) is None  # no file yet
    (ws / "sample.py").write_text(stub_source("sample"), encoding="utf-8")
    assert side.yours("sample", ws) is None  # still the stub
    (ws / "sample.py").write_text(reference_source("sample") + "\nMINE = 1\n", encoding="utf-8")
    mine, ref = side.yours("sample", ws), side.reference("sample")
    assert mine.__name__ == "tl_lab.exercise.side.yours_sample" and mine.MINE == 1 and sys.modules[mine.__name__] is mine
    assert ref.__name__ == "tl_lab.exercise.side.reference_sample" and not hasattr(ref, "MINE")
    assert mine.__file__ == str(ws / "sample.py") and ref.__file__ == str(side.reference_path("sample"))
    assert side.yours("sample", ws) is not mine  # a fresh module each call
    (ws / "sample.py").write_text("import numpy\n\nx = 1 / 0\n", encoding="utf-8")
    assert side.yours_or_none("sample", ws) is None
    assert "tl_lab.exercise.side.yours_sample" not in sys.modules  # nothing half-imported is kept
    assert capsys.readouterr().out == (f"your sample.py does not import: {ws / 'sample.py'}:3: ZeroDivisionError: "
                                       "division by zero; the reference's is shown alone\n")
    (ws / "sample.py").write_text("def f(:\n", encoding="utf-8")
    assert side.yours_or_none("sample", ws) is None
    said = capsys.readouterr().out
    assert said.startswith(f"your sample.py does not import: {ws / 'sample.py'}:1: SyntaxError: ")
    with pytest.raises(SyntaxError):
        side.yours("sample", ws)  # as it is, from the learner's file
    (ws / "sample.py").write_text("from tl_lab.exercise.side import no_such_name\n", encoding="utf-8")
    assert side.yours_or_none("sample", ws) is None
    assert capsys.readouterr().out.startswith(f"your sample.py does not import: {ws / 'sample.py'}:1: ImportError: ")


def test_in_process_side_says_where_yours_raised(tmp_path):
    from tl_lab.exercise import side

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "sample.py").write_text(reference_source("sample") + "\n\ndef broken():\n    return 1 / 0\n",
                                  encoding="utf-8")
    mine = side.yours("sample", ws)
    try:
        mine.broken()
    except ZeroDivisionError as exc:
        said = side.raised(exc, mine, "sample")
    line = len(reference_source("sample").splitlines()) + 4
    assert said.startswith(f"your sample.py raised at {ws / 'sample.py'}:{line} in broken: ZeroDivisionError: "
                           "division by zero; hint: reread ")


def test_in_process_side_reference_against_hf_is_the_compare_of_the_tiny_llama():
    from tl_lab.compare import hf_golden_cases
    from tl_lab.exercise import side

    got = side._against_hf(16)
    cases = hf_golden_cases()
    assert got["lengths"] == [len(c["tokens"]) for c in cases] and len(got["z"]) == len(cases)
    assert all(e <= b for e, b in zip(got["errors"], got["bounds"]))
    assert [max(abs(a - b) for a, b in zip(z, c["z"])) for z, c in zip(got["z"], cases)] == pytest.approx(got["errors"])


@pytest.fixture
def plugin(monkeypatch):
    """tl_lab.exercise.plugin with its environment's values and its collected results its own."""
    from tl_lab.exercise import plugin as p

    monkeypatch.setattr(p, "_results", [])
    monkeypatch.setattr(p, "_errors", [])
    monkeypatch.setattr(p, "GRADE", "kv")
    monkeypatch.setattr(p, "REPORT", "")
    return p


def _item(nodeid):
    import types

    return types.SimpleNamespace(nodeid=nodeid)


def test_in_process_plugin_keeps_only_the_graded_modules_tests(plugin, monkeypatch):
    import types

    kv = [f"tests/test_kv.py::test_{g.name}" for g in graded("kv")]
    other = ["tests/test_kv.py::test_a_lab_test", f"tests/test_sample.py::test_{graded('sample')[0].name}"]
    items, dropped = [_item(n) for n in [other[0], *kv, other[1]]], []
    config = types.SimpleNamespace(hook=types.SimpleNamespace(pytest_deselected=lambda items: dropped.extend(items)))
    plugin.pytest_collection_modifyitems(None, config, items)
    assert [it.nodeid for it in items] == kv and [it.nodeid for it in dropped] == other
    items = [_item(n) for n in kv]
    plugin.pytest_collection_modifyitems(None, config, items)  # nothing to drop: no deselection
    assert len(items) == len(kv) and len(dropped) == 2
    monkeypatch.setattr(plugin, "GRADE", "")
    items = [_item(n) for n in other]
    plugin.pytest_collection_modifyitems(None, config, items)  # no module graded: the lab's own run
    assert [it.nodeid for it in items] == other


def test_in_process_plugin_stops_a_run_without_the_learners_code(plugin, tmp_path, monkeypatch):
    import json

    import tl_lab.kv  # the reference, imported before any finder below could serve another
    from tl_lab.exercise import workspace as wsm

    report = tmp_path / "report.json"
    monkeypatch.setattr(plugin, "REPORT", str(report))
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if not isinstance(f, wsm.WorkspaceFinder)])
    with pytest.raises(pytest.exit.Exception) as stop:
        plugin.pytest_collection_finish(None)
    assert stop.value.returncode == 3 and str(stop.value.msg) == (
        "exercise: no workspace is active: tl_lab.kv would be the reference's")
    written = json.loads(report.read_text())
    assert written["grade"] == "kv" and written["errors"] == [
        {"kind": "origin", "message": "no workspace is active: tl_lab.kv would be the reference's"}]
    assert set(written["origins"]) == set(MODULES) and written["results"] == []
    monkeypatch.setattr(plugin, "GRADE", "")
    plugin.pytest_collection_finish(None)  # the lab's own run: nothing to hold to
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "kv.py").write_text("# mine\n", encoding="utf-8")
    origins = {"kv": wsm.Origin("kv", "learner", str(ws / "kv.py"), "the learner's file")}
    monkeypatch.setattr(sys, "meta_path", [wsm.WorkspaceFinder(ws, origins), *sys.meta_path])
    with pytest.raises(pytest.exit.Exception, match=f"tl_lab.kv was loaded from {tl_lab.kv.__file__}, not the "
                                                    f"learner's {ws / 'kv.py'}"):
        plugin.pytest_collection_finish(None)
    origins["kv"] = wsm.Origin("kv", "learner", tl_lab.kv.__file__, "as if it were")
    origins["quant"] = wsm.Origin("quant", "reference", "elsewhere", "not the learner's")
    plugin.pytest_collection_finish(None)  # the learner's module is where it was meant to be: no stop


def test_in_process_plugin_reports_each_test_and_each_collection_error(plugin):
    import types

    name = graded("kv")[0].name

    def report(nodeid, when, outcome, longrepr=None, duration=0.12345):
        return types.SimpleNamespace(nodeid=nodeid, when=when, outcome=outcome, passed=outcome == "passed",
                                     failed=outcome == "failed", longrepr=longrepr, duration=duration)

    crash = types.SimpleNamespace(reprcrash=types.SimpleNamespace(message="AssertionError: 1 != 2"))
    plugin.pytest_runtest_logreport(report(f"tests/test_kv.py::test_{name}", "setup", "passed"))  # not kept
    plugin.pytest_runtest_logreport(report(f"tests/test_kv.py::test_{name}[3]", "call", "passed"))
    plugin.pytest_runtest_logreport(report(f"tests/test_kv.py::test_{name}[4]", "call", "failed", crash))
    plugin.pytest_runtest_logreport(report("tests/test_kv.py::test_lab", "setup", "failed", "x" * 3000))
    assert plugin._results == [
        {"nodeid": f"tests/test_kv.py::test_{name}[3]", "chapter_test": name, "when": "call", "outcome": "passed",
         "message": "", "seconds": 0.123},
        {"nodeid": f"tests/test_kv.py::test_{name}[4]", "chapter_test": name, "when": "call", "outcome": "failed",
         "message": "AssertionError: 1 != 2", "seconds": 0.123},
        {"nodeid": "tests/test_kv.py::test_lab", "chapter_test": None, "when": "setup", "outcome": "failed",
         "message": "x" * plugin.MESSAGE_CHARS, "seconds": 0.123}]
    plugin.pytest_collectreport(report("tests/test_kv.py", "collect", "passed"))
    plugin.pytest_collectreport(report("tests/test_kv.py", "collect", "failed", "a" * 10 + "b" * plugin.MESSAGE_CHARS))
    assert plugin._errors == [{"kind": "collect", "nodeid": "tests/test_kv.py", "message": "b" * plugin.MESSAGE_CHARS}]
    plugin._write()  # no report asked for: nothing written, nothing raised


def test_in_process_plugin_limits_each_test(plugin, monkeypatch):
    import signal

    with pytest.raises(plugin.TestTimeout, match=r"^the test ran longer than 2\.5 s \(an infinite loop\?\)$"):
        monkeypatch.setattr(plugin, "TIMEOUT", 2.5)
        plugin._on_alarm(signal.SIGALRM, None)
    before = signal.getsignal(signal.SIGALRM)
    wrapper = plugin.pytest_runtest_call(None)
    next(wrapper)  # the test runs here
    assert signal.getsignal(signal.SIGALRM) == plugin._on_alarm and 2.0 < signal.getitimer(signal.ITIMER_REAL)[0] <= 2.5
    with pytest.raises(StopIteration):
        next(wrapper)
    assert signal.getsignal(signal.SIGALRM) == before and signal.getitimer(signal.ITIMER_REAL)[0] == 0
    monkeypatch.setattr(plugin, "TIMEOUT", 0)
    wrapper = plugin.pytest_runtest_call(None)
    next(wrapper)
    assert signal.getsignal(signal.SIGALRM) == before and signal.getitimer(signal.ITIMER_REAL)[0] == 0  # no limit
    with pytest.raises(StopIteration):
        next(wrapper)
