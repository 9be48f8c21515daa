"""tl_lab/exercise: the learner's workspace, the stubs, and the chapter's tests as the verdict.

Kept honest: every stub imports; a workspace of reference copies passes `exercise check`; start never
overwrites, reset keeps a backup; the stubs are the generator's output from the reference, nothing
hand-kept. The graded runs that show every piece and pitfall is graded are in
tests/test_exercise_graded_runs.py, the notebooks on a workspace in tests/test_exercise_notebooks.py.
"""

import ast
import json
import os
import subprocess
import sys
import time

import pytest

from conftest import need, workspace
from tl_lab.lab.exercise import registry
from tl_lab.lab.exercise.cli import reset, start, written
from tl_lab.lab.exercise.grading import check, format_table
from tl_lab.lab.exercise.registry import CATALOGUE, DEPS, MODULES, PIECES, graded
from tl_lab.lab.exercise.stubs import ExerciseError, blank, learner_lines, reference_source, stub_source
from tl_lab.ops.paths import REPO_ROOT
from tl_lab.lab.pitfalls import PITFALLS, apply_edit

PY = sys.executable


def cli(*args, env=None):
    full = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})}
    return subprocess.run([PY, "-m", "tl_lab", "exercise", *args], cwd=REPO_ROOT, env=full, capture_output=True,
                          text=True, timeout=900)


# ------------------------------------------------------------------ the registry and the stubs


def test_the_catalogue_is_the_chapters_24_each_with_tests():
    assert len(CATALOGUE) == 24 and len({g.name for g in CATALOGUE}) == 24
    ids = subprocess.run([PY, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          *sorted({g.file for g in CATALOGUE})], cwd=REPO_ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}).stdout.split()
    for g in CATALOGUE:
        assert [n for n in ids if registry.match(n) == g], f"no test of ours for {g.name}"
    assert all(registry.match(n) is None for n in ids if n.endswith("[fast]"))  # the engine's vectorized twin is not graded


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
            "from tl_lab.lab.exercise import origins\nprint(json.dumps(origins()))")
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
    code = ("import tl_lab.sample, tl_lab.quant\nfrom tl_lab.lab.exercise import origins\n"
            "o = origins(); print(o['sample']['origin'], o['quant']['origin'])\ntl_lab.quant.round_half_even(5, 1)")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TL_LAB_WORKSPACE": str(ws)}
    p = subprocess.run([PY, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert p.stdout.split() == ["reference", "learner"]
    assert f'File "{ws / "quant.py"}", line {line}, in round_half_even' in p.stderr and "1 / 0" in p.stderr


def test_the_projects_own_tests_see_no_workspace():
    """The clone's root conftest.py: a clone's work/L10.1 is not used unless TL_LAB_WORKSPACE asks for it."""
    from tl_lab.lab.exercise import origins

    assert os.environ["TL_LAB_WORKSPACE"] == "off" or "PYTEST_XDIST_WORKER" in os.environ
    assert all(o["origin"] == "reference" for o in origins().values())


def test_a_notebook_run_alone_under_nbval_grades_the_reference_despite_a_learners_work_folder(tmp_path):
    """`pytest --nbval-lax notebooks/X.ipynb` with no file of tests/ in the run, TL_LAB_WORKSPACE unset, in a
    clone with a learner's work/L10.1: the notebook runs the reference. Was: the setdefault lived in
    tests/conftest.py, which such a run never loads, so 04's first cell took the learner's kv.py (cells 6 and 7
    failed on one that evicts the newest block). A copy of the package, the root conftest.py and pyproject.toml
    (the rootdir), with such a kv.py in work/L10.1, and a notebook of 04's first cell and an assert on kv's origin."""
    import shutil

    nbformat = need("nbformat")
    clone = tmp_path / "clone"
    shutil.copytree(REPO_ROOT / "tl_lab", clone / "tl_lab", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("conftest.py", "pyproject.toml"):
        shutil.copy(REPO_ROOT / name, clone / name)
    (clone / "work" / "L10.1").mkdir(parents=True)
    (clone / "work" / "L10.1" / "kv.py").write_text(apply_edit(reference_source("kv"), PITFALLS["s18"].edits[0], "s18"))
    real = nbformat.read(REPO_ROOT / "notebooks" / "04_kv_pool.ipynb", 4)
    first = next(c for c in real.cells if c.cell_type == "code")
    nb = nbformat.v4.new_notebook(metadata=real.metadata, cells=[first, nbformat.v4.new_code_cell(
        'assert exercise.origins()["kv"]["origin"] == "reference", exercise.origins()["kv"]')])
    (clone / "notebooks").mkdir()
    nbformat.write(nb, clone / "notebooks" / "probe.ipynb")
    unset = ("TL_LAB_WORKSPACE", "TL_LAB_PITFALL", "TL_LAB_EXERCISE_USE")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env.update(PYTHONPATH=str(clone), PY_COLORS="0")

    # the control: outside pytest, the copy's first cell does take the learner's kv.py (the guard lets it through)
    code = "from tl_lab import exercise; exercise.activate(quiet=True); print(exercise.origins()['kv']['origin'])"
    p = subprocess.run([PY, "-c", code], cwd=clone, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.split()[-1] == "learner", (p.stdout, p.stderr)

    p = subprocess.run([PY, "-m", "pytest", "--nbval-lax", "-q", "-p", "no:cacheprovider", "notebooks/probe.ipynb"],
                       cwd=clone, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and "2 passed" in p.stdout.splitlines()[-1], p.stdout[-3000:]


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


def test_TL_LAB_PITFALL_with_TL_LAB_WORKSPACE_is_one_line_and_exit_2_and_raised_where_a_program_imports(tmp_path):
    """Was: both honoured, the first hook on sys.meta_path won module by module (a command ran s19's kv.py
    beside the learner's other files; a notebook's first cell put the learner's kv.py first, and s19 silently
    did nothing). Now refused in one line naming both, before anything runs."""
    ws = workspace(tmp_path, "ref", ["kv"])
    line = (f"TL_LAB_PITFALL=s19 does not combine with the workspace {ws}: a pitfall edits the reference's code, "
            "not a learner's; unset TL_LAB_PITFALL, or run without the workspace")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TL_LAB_WORKSPACE": str(ws), "TL_LAB_PITFALL": "s19"}
    for argv in (["generate", "--model", "bigram", "--prompt", "ab", "--max-tokens", "2"], ["exercise", "status"]):
        p = subprocess.run([PY, "-m", "tl_lab", *argv], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                           timeout=300)
        assert (p.returncode, p.stdout, p.stderr) == (2, "", f"error: {line}\n"), argv
    code = "try:\n    from tl_lab import exercise\nexcept Exception as e:\n    print(type(e).__name__, e)"
    p = subprocess.run([PY, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.stdout == f"PitfallError {line}\n", (p.stdout, p.stderr)  # a program: the same line
    cell = ("from IPython.core.interactiveshell import InteractiveShell\n"
            "InteractiveShell.instance().run_cell('from tl_lab import exercise')")
    p = subprocess.run([PY, "-c", cell], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.stdout == f"PitfallError: {line}\n", (p.stdout, p.stderr)  # a notebook's cell: the line, no traceback


_ACTIVATE = """import sys
from pathlib import Path
import tl_lab.lab.exercise.workspace as w
w.default_workspace = lambda: Path(sys.argv[1])  # the clone's work/L10.1, here the test's folder
from tl_lab.lab import exercise
exercise.activate(*sys.argv[2:])
from tl_lab.lab.pitfalls import PROBES
print(exercise.origins()["kv"]["origin"], "|", PROBES["zero_pool"]()["refused_at"])
"""


@pytest.mark.parametrize("pitfall", [None, "s19"])
def test_with_TL_LAB_PITFALL_the_first_cell_leaves_work_and_runs_the_pitfall_saying_so(tmp_path, pitfall):
    """A notebook's first cell in a clone with a work/L10.1 (a copy of the reference's kv.py): without a
    pitfall it takes the learner's kv.py (the control); with TL_LAB_PITFALL=s19 it does not (was: it did, and
    the zero-block pool was refused at once, s19 silently doing nothing), says so in its one line, and s19 is
    on. A workspace named to activate() with the pitfall on is the one line of TL_LAB_WORKSPACE with it."""
    ws = workspace(tmp_path, "ref", ["kv"])
    env = {k: v for k, v in os.environ.items() if k not in ("TL_LAB_WORKSPACE", "TL_LAB_PITFALL")}
    env.update(PYTHONPATH=str(REPO_ROOT), **({"TL_LAB_PITFALL": pitfall} if pitfall else {}))

    def first_cell(*named):
        p = subprocess.run([PY, "-c", _ACTIVATE, str(ws), *named], cwd=REPO_ROOT, env=env, capture_output=True,
                           text=True, timeout=300)
        assert p.returncode == 0, p.stderr
        return p.stdout.splitlines()

    out = first_cell()
    if pitfall is None:
        assert out[-1] == "learner | KvPool(KvCfg(n_blocks=0, ...))", out
        return
    assert out[0] == (f"no workspace: TL_LAB_PITFALL=s19 is on, and a pitfall edits the reference, so every module "
                      f"is the reference's (your {ws} is not used)"), out
    assert out[-1] == "reference | pool.alloc(1), later", out
    out = first_cell(str(ws))
    assert out[0] == (f"error: TL_LAB_PITFALL=s19 does not combine with the workspace {ws}: a pitfall edits the "
                      "reference's code, not a learner's; unset TL_LAB_PITFALL, or run without the workspace; this "
                      "notebook runs the reference's modules (fix it, then restart the kernel)"), out
    assert out[-1] == "reference | pool.alloc(1), later", out


def test_a_bad_TL_LAB_WORKSPACE_is_raised_where_a_program_imports_the_learners_modules(tmp_path):
    code = ("import tl_lab, tl_lab.engine.tokenizer\ntry:\n    import tl_lab.sample\nexcept Exception as e:\n"
            "    print(type(e).__name__, e)")
    p = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "TL_LAB_WORKSPACE": str(tmp_path / "nope")})
    assert p.stdout == (f"ExerciseError TL_LAB_WORKSPACE={tmp_path / 'nope'}: workspace {tmp_path / 'nope'} does not "
                        f"exist: python -m tl_lab exercise start --workspace {tmp_path / 'nope'} writes it\n"), \
        (p.stdout, p.stderr)


def test_an_unreadable_or_unwritable_workspace_is_named(tmp_path, monkeypatch):
    """Permissions through os.access (these tests may run as root, who reads and writes anything)."""
    from tl_lab.lab.exercise.workspace import usable

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
        f"python -m tl_lab exercise check --workspace {ws} from the clone\n"), p.stderr
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
    (row,) = check(ws, ["kv"], timeout=1)  # its message says the limit stopped it, not the run's budget
    assert row.state == "failed" and "ran longer than 1 s" in row.message
    assert "ran past the 1 s limit" in row.hint and row.first_failure


def test_a_module_whose_test_runs_past_the_limit_runs_none_of_its_later_tests(tmp_path):
    """A sample() that never returns: the first of its tests to call it ends the module's check (one limit,
    not one per test); the test before it, which never calls sample(), keeps its pass. The limit is 10 s,
    not 1: the honest test before the looping one (a few ms here) must end within it on a busy machine too;
    the loop sleeps, so waiting for the limit takes no CPU."""
    ws = workspace(tmp_path, "ref", ["sample"])
    src = reference_source("sample")
    body = src.index('"""', src.index('"""', src.index("\ndef sample(")) + 3) + 3  # after sample's docstring
    loop = "\n    import time\n\n    while True:\n        time.sleep(0.1)"
    (ws / "sample.py").write_text(src[:body] + loop + src[body:])
    (row,) = check(ws, ["sample"], timeout=10)
    names = [g.name for g in graded("sample")]
    first, looping = "pcg32_reference_vectors", "hand_example_sampling"  # the order of tests/test_sample.py
    assert row.results == {first: "passed", looping: "failed",
                           **{n: "not run" for n in names if n not in (first, looping)}}
    assert (row.passed, row.total, row.first_failure) == (1, len(names), looping)
    assert f"not run after it: {len(names) - 2} of its chapter tests" in row.message
    log = open(row.log, encoding="utf-8").read()
    # one time-out, not one per test; pytest's short summary repeats it on a line whose width follows the
    # terminal's (COLUMNS), so that line is not counted
    stopped = [line for line in log.splitlines() if "ran longer than 10 s" in line and not line.startswith("FAILED ")]
    assert len(stopped) == 1 and stopped[0].startswith("E   tl_lab.lab.exercise.plugin.TestTimeout"), log
    assert f"SKIPPED [{len(names) - 2}] " in log
    assert f"not run: test_{looping}[spec] of this module ran past the 10 s limit" in log


def test_a_test_whose_code_catches_the_time_out_and_passes_fails_at_the_limit(tmp_path):
    """The learner's code tries to catch the time-out (an `except Exception` around a wait): it cannot, since
    the test and its alarm run in the grader and the learner's code in the sandboxed child, so the test
    fails at the limit with the time-out's hint, and the module's later tests are not run (never a row
    "passed" or "failed" with no failing test). The wait is in
    the first Pcg32 made, which the module's first test makes: no honest test before it has to end in time."""
    ws = workspace(tmp_path, "ref", ["sample"])
    src = reference_source("sample")
    init = src.index("\n", src.index("    def __init__(self, seed: int, seq: int):")) + 1
    wait = ("        if not _WAITED:\n            _WAITED.append(1)\n            try:\n"
            "                time.sleep(120)\n            except Exception:\n                pass\n")
    cls = src.index("\nclass Pcg32:")
    (ws / "sample.py").write_text(src[:cls] + "\nimport time\n\n_WAITED = []\n\n" + src[cls:init] + wait + src[init:])
    (row,) = check(ws, ["sample"], timeout=1)
    names = [g.name for g in graded("sample")]
    first = "pcg32_reference_vectors"  # the first of tests/test_sample.py
    assert row.results == {first: "failed", **{n: "not run" for n in names if n != first}}
    assert (row.state, row.passed, row.total, row.first_failure) == ("failed", 0, len(names), first)
    assert row.message.splitlines()[0].startswith(f"test_{first}: ") and "TestTimeout" in row.message, row.message
    assert row.message.splitlines()[-1] == (
        f"not run after it: {len(names) - 1} of its chapter tests (a module's first test past the limit ends its check)")
    assert row.hint == f"test_{first} ran past the 1 s limit: a loop that never ends?"
    log = open(row.log, encoding="utf-8").read()
    assert f"FAILED tests/test_sample.py::test_{first} - " in log and "TestTimeout" in log, log  # pytest's own verdict too
    assert f"not run: test_{first} of this module ran past the 1 s limit" in log


def test_a_loop_at_a_modules_top_level_ends_at_the_collections_limit(tmp_path):
    """Importing the learner's module never ends: "does not import" at the loop's line after the
    collection's limit, not "not run" when the whole run's budget (about an hour) is spent."""
    from tl_lab.lab.exercise.plugin import COLLECT_FLOOR

    ws = workspace(tmp_path, "ref", ["quant"])
    text = reference_source("quant") + "\nwhile True:\n    pass\n"
    (ws / "quant.py").write_text(text)
    (row,) = check(ws, ["quant"], timeout=1)
    assert row.state == "does not import"  # and the message: stopped by the collection's limit
    # the learner's file and the line it looped at first (the sandboxed child's stack, dumped just before the
    # limit: was the file alone), never pytest's words about test module names
    loop = text.count(chr(10)) - 1  # `while True:`; the dump may catch the child on the loop's body, the next line
    assert any(row.message.startswith(f"{ws / 'quant.py'}:{n}: ") for n in (loop, loop + 1)), row.message
    assert f"importing the modules ran longer than {COLLECT_FLOOR:g} s" in row.message
    assert row.hint.startswith("importing quant.py never ended (a loop at its top level?)")


# ------------------------------------------------------------------ the verdicts


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
    assert p.returncode == 0 and "parity sampler (against data/golden/sampler.json): 12/12 cases identical" in p.stdout, p.stdout + p.stderr


def test_blocked_without_ref_deps_and_borrowed_with_it(tmp_path):
    ws = workspace(tmp_path, "ref", ["model"])
    (ws / "quant.py").write_text(stub_source("quant"))
    rows = {r.module: r for r in check(ws, ["model"])}
    assert rows["quant"].state == "not started" and rows["model"].state == "blocked"
    assert "blocked by quant" in rows["model"].message
    rows = {r.module: r for r in check(ws, ["model"], ref_deps=True)}
    assert rows["model"].state == "passed" and rows["model"].uses["quant"] == "reference (--ref-deps)"
    assert "quant: reference (--ref-deps)" in format_table(list(rows.values()))


def test_written_counts_the_pieces_left_to_write(tmp_path):
    ws = workspace(tmp_path, modules=["forward"])
    assert not any(written(ws, "forward").values())
    (ws / "forward.py").write_text(blank(reference_source("forward"), "forward", {"silu"}))
    done = written(ws, "forward")
    assert [q for q, v in done.items() if not v] == ["silu"]
    assert DEPS["forward"] == ("quant", "kv", "model")


def test_learner_lines_are_the_lines_each_stub_takes_out():
    """Each piece's body of n lines becomes one raise: the stub is shorter by n - 1 per piece."""
    for m in MODULES:
        header = 3  # the stub's own lines above the reference's
        removed = len(reference_source(m).splitlines()) - (len(stub_source(m).splitlines()) - header)
        sizes = learner_lines(m)
        assert set(sizes) == {p.qualname for p in PIECES[m]} and min(sizes.values()) >= 1, m
        assert sum(n - 1 for n in sizes.values()) == removed, m


def test_a_piece_with_only_a_docstring_or_an_unknown_module_is_refused_in_words():
    from tl_lab.lab.exercise.stubs import _body_span, check_module

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


def test_origins_say_which_file_each_loaded_module_came_from():
    import tl_lab.kv
    from tl_lab.lab.exercise import workspace as wsm

    got = wsm.origins()
    assert set(got) == set(MODULES) and got["kv"]["loaded"] == tl_lab.kv.__file__
    assert all(o["origin"] == "reference" and o["why"] == "no workspace active" for o in got.values())


def test_the_tests_command_lists_the_catalogue_row_by_row(tmp_path, capsys):
    """`exercise tests`: each chapter test with its kind, module, our test, what it checks and why."""
    from tl_lab.__main__ import main

    assert main(["exercise", "tests", "--workspace", str(tmp_path)]) == 0  # a workspace with no results yet
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["chapter", "test", "kind", "module", "last", "our", "test"]
    assert lines[-1].startswith("24 tests; you write no graded tests here (rung R0). Our test of each is the pytest function"), lines[-1]
    rows = [i for i, line in enumerate(lines) if line and not line.startswith(" ")][1:-1]
    assert len(rows) == len(CATALOGUE)
    for i, g in zip(rows, CATALOGUE):
        assert lines[i].split() == [g.name, *g.kind.split(), g.module, "-", f"{g.file}::test_{g.name}"]
        assert lines[i + 1].strip() == f"checks: {g.checks}" and lines[i + 2].strip() == f"why: {g.why}"
        assert (lines[i + 3].strip() == f"with: {', '.join(g.also)}") == bool(g.also)


@pytest.mark.parametrize("mode,says", [
    ("exit", "in sample: SystemExit: 0"),
    ("mem", "in sample: MemoryError: mine"),
    ("os", "in sample: FileNotFoundError: "),
    ("id", "returned token id 1000000000, outside the vocabulary (0 .. 255)"),
])
def test_generate_names_the_learners_sample_for_whatever_it_raises_or_returns(tmp_path, mode, says):
    """Issue #61: with TL_LAB_WORKSPACE, a sys.exit in the learner's sample() was exit 0 with no output; their
    MemoryError said "try a smaller model", their OSError a bare strerror, an id outside the vocabulary blamed
    the prompt (exit 2). Each is now exit 4, one line naming their sample.py."""
    ws = workspace(tmp_path, "reference", ["sample"])
    with (ws / "sample.py").open("a", encoding="utf-8") as f:
        f.write("\n\n_real = sample\n\n\ndef sample(*a, **k):\n    import os\n    mode = os.environ['PROBE']\n"
                "    if mode == 'exit':\n        raise SystemExit(0)\n    if mode == 'mem':\n        raise MemoryError('mine')\n"
                "    if mode == 'os':\n        raise OSError(2, 'No such file', '/nope')\n    return 10**9, 0.0\n")
    p = subprocess.run([sys.executable, "-m", "tl_lab", "generate", "--model", "tiny-llama", "--prompt", "hi",
                        "--max-tokens", "2"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "TL_LAB_WORKSPACE": str(ws), "PROBE": mode})
    assert p.returncode == 4 and len(p.stderr.splitlines()) == 1, p.stderr
    assert str(ws / "sample.py") in p.stderr and says in p.stderr, p.stderr


def test_generate_stops_a_loop_at_the_import_of_the_learners_module(tmp_path):
    """Issue #61: with TL_LAB_WORKSPACE, a sample.py that loops at its top level hung generate for good; its
    import is now limited (TL_LAB_IMPORT_SECONDS, default 120 s): exit 4, one line naming the file and line."""
    ws = workspace(tmp_path, "reference", ["sample"])
    with (ws / "sample.py").open("a", encoding="utf-8") as f:
        f.write("\nwhile True:\n    pass\n")
    line = (ws / "sample.py").read_text(encoding="utf-8").count("\n") - 1
    p = subprocess.run([sys.executable, "-m", "tl_lab", "generate", "--model", "tiny-llama", "--prompt", "hi"],
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "TL_LAB_WORKSPACE": str(ws),
                            "TL_LAB_IMPORT_SECONDS": "2"})
    assert p.returncode == 4 and len(p.stderr.splitlines()) == 1, p.stderr
    assert f"{ws / 'sample.py'}:{line} in (import): ImportTimeout: the import of your sample.py ran longer than 2 s" in p.stderr
