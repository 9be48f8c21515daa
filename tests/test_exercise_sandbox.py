"""Issue #61: the verdict is computed where the learner's code never runs, and the learner's code runs sandboxed.

Each cheat below passed `exercise check kv` (exit 0) before: an untouched stub plus a few lines that patch
pytest, the plugin's writer or the report, or that rewrite the graded tests. Now the tests run in a process
that never imports the learner's file (tl_lab.lab.exercise.remote), so each of them fails its check."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tl_lab.lab.exercise import sandbox
from tl_lab.lab.exercise.stubs import stub_source
from tl_lab.lab.exercise.workspace import REPO_ROOT

CHEATS = {
    "runtest": "import _pytest.python\n_pytest.python.Function.runtest = lambda self: None\n",
    "writer": "import tl_lab.lab.exercise.plugin as p\np._write = lambda: None\n",
    "atexit": ("import atexit, json, os\n"
               "def forge():\n"
               "    r = os.environ.get('TL_LAB_EXERCISE_REPORT')\n"
               "    if r:\n"
               "        open(r, 'w').write(json.dumps({'grade': 'kv', 'errors': [], 'origins': {}, 'results': []}))\n"
               "atexit.register(forge)\n"),
    "tests": ("from pathlib import Path\n"
              f"p = Path({str(REPO_ROOT / 'tests' / 'test_kv.py')!r})\n"
              "try:\n    p.write_text(p.read_text() + '\\n')\nexcept OSError:\n    pass\n"),
}


def _check(ws: Path, module: str = "kv", timeout: float = 60) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TL_LAB_WORKSPACE"}
    env["PYTHONPATH"] = str(REPO_ROOT)
    return subprocess.run([sys.executable, "-m", "tl_lab", "exercise", "check", module, "--workspace", str(ws),
                           "--timeout", f"{timeout:g}"], capture_output=True, text=True, env=env, timeout=600, cwd=REPO_ROOT)


@pytest.mark.parametrize("cheat", sorted(CHEATS))
def test_a_cheat_on_an_untouched_stub_fails_its_check(tmp_path, cheat):
    before = (REPO_ROOT / "tests" / "test_kv.py").read_bytes()
    (tmp_path / "kv.py").write_text(stub_source("kv") + "\n" + CHEATS[cheat], encoding="utf-8")
    r = _check(tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "kv       passed" not in r.stdout
    assert (REPO_ROOT / "tests" / "test_kv.py").read_bytes() == before  # the repository is read-only to it


def test_the_learner_process_cannot_write_the_tree_or_reach_the_network(tmp_path):
    if sandbox.bwrap() is None:
        pytest.skip("no bubblewrap here")
    code = ("import socket, pathlib\n"
            f"try:\n    pathlib.Path({str(REPO_ROOT / 'x-i61')!r}).write_text('x')\n    print('wrote')\n"
            "except OSError as e:\n    print('refused', e.errno)\n"
            "try:\n    socket.create_connection(('1.1.1.1', 53), timeout=2)\n    print('net')\n"
            "except OSError:\n    print('no net')\n")
    r = sandbox.run([sys.executable, "-c", code], workspace=tmp_path, timeout=60)
    assert r.sandboxed and "refused" in r.stdout and "no net" in r.stdout, r
    assert not (REPO_ROOT / "x-i61").exists()


def test_output_is_capped_and_the_whole_group_ends_at_the_time_limit(tmp_path):
    code = ("import os, sys, time\n"
            "if os.fork() == 0:\n    time.sleep(300)\n"
            "while True:\n    sys.stdout.write('x' * 65536)\n")
    r = sandbox.run([sys.executable, "-c", code], workspace=tmp_path, timeout=3, output_cap=1 << 16)
    assert r.timed_out and r.seconds < 20
    assert "more not kept" in r.stdout and len(r.stdout) < (1 << 16) + 200


def test_a_timeout_out_of_range_is_refused():
    for bad in (0, -1, float("nan"), float("inf"), 1e10):
        with pytest.raises(ValueError, match="at most a day"):
            sandbox.run([sys.executable, "-c", "pass"], timeout=bad)


def _cmd(*args) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TL_LAB_WORKSPACE"}
    env["PYTHONPATH"] = str(REPO_ROOT)
    return subprocess.run([sys.executable, "-m", "tl_lab", *args], capture_output=True, text=True, env=env,
                          timeout=120, cwd=REPO_ROOT)


def test_a_fifo_or_a_link_to_a_device_as_kv_py_is_never_read(tmp_path):
    os.mkfifo(tmp_path / "kv.py")
    r = _cmd("exercise", "check", "kv", "--workspace", str(tmp_path))
    assert r.returncode == 1 and "not a regular file" in r.stdout
    (tmp_path / "kv.py").unlink()
    os.symlink("/dev/zero", tmp_path / "kv.py")
    r = _cmd("exercise", "check", "kv", "--workspace", str(tmp_path))
    assert r.returncode == 1 and "not a regular file" in r.stdout


def test_a_link_where_the_status_is_written_is_replaced_not_written_through(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("untouched\n")
    ws = tmp_path / "ws"
    (ws / ".tl_lab").mkdir(parents=True)
    (ws / "kv.py").write_text(stub_source("kv"))
    os.symlink(outside, ws / ".tl_lab" / "status.tmp")
    os.symlink(outside, ws / ".tl_lab" / "check-kv.log")
    _cmd("exercise", "check", "kv", "--workspace", str(ws))
    assert outside.read_text() == "untouched\n"
    assert not (ws / ".tl_lab" / "status.json").is_symlink()


def test_a_corrupt_status_is_no_status(tmp_path):
    (tmp_path / ".tl_lab").mkdir()
    (tmp_path / ".tl_lab" / "status.json").write_text("[1, 2]")
    r = _cmd("exercise", "status", "--workspace", str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_package_is_refused_as_a_workspace():
    r = _cmd("exercise", "reset", "kv", "--workspace", str(REPO_ROOT / "tl_lab"))
    assert r.returncode == 2 and "inside the repository" in r.stderr + r.stdout
    assert (REPO_ROOT / "tl_lab" / "kv.py").is_file()


@pytest.mark.parametrize("bad", ["0", "-1", "nan", "inf", "1e10"])
def test_a_timeout_out_of_range_exits_2_in_one_line(tmp_path, bad):
    r = _cmd("exercise", "check", "kv", "--workspace", str(tmp_path), "--timeout", bad)
    assert r.returncode == 2 and len((r.stdout + r.stderr).strip().splitlines()) == 1


def test_a_flood_of_prints_at_import_is_kept_to_a_megabyte(tmp_path):
    (tmp_path / "kv.py").write_text(stub_source("kv") + "\nwhile True:\n    print('x' * 1000)\n")
    r = _cmd("exercise", "check", "kv", "--workspace", str(tmp_path), "--timeout", "5")
    assert r.returncode == 1
    out = tmp_path / ".tl_lab" / "check-kv.output.log"
    assert out.is_file() and out.stat().st_size < (1 << 20) + 1000 and "more not kept" in out.read_text()
    assert (tmp_path / ".tl_lab" / "check-kv.log").stat().st_size < 1 << 20


def test_check_names_the_line_of_a_learners_keyboard_interrupt_or_sys_exit_at_import(tmp_path):
    """Issue #61: a kv.py raising KeyboardInterrupt (or SystemExit) at its top level was "does not import" naming
    the file alone: the sandboxed child knew the learner's files only once imported. Its line is named now, as
    for an error inside a piece ("raised at FILE:LINE in KvPool.alloc")."""
    from tl_lab.lab.exercise.stubs import reference_source

    f = tmp_path / "kv.py"
    for error in ("KeyboardInterrupt", "SystemExit"):
        f.write_text(reference_source("kv") + f"\nraise {error}('mine')\n", encoding="utf-8")
        line = f.read_text().count("\n")
        r = _check(tmp_path)
        assert r.returncode == 1 and "kv       does not import" in r.stdout, r.stdout + r.stderr
        assert f"{f}:{line}: E   {error}: mine" in r.stdout, r.stdout
    text = reference_source("kv")
    f.write_text(text.replace("    def alloc(self", "    def alloc(self, *a, **k):\n        raise KeyboardInterrupt('mine')\n\n"
                              "    def _was_alloc(self", 1), encoding="utf-8")
    line = text[: text.index("    def alloc(self")].count("\n") + 2
    r = _check(tmp_path)
    assert r.returncode == 1 and "kv       failed" in r.stdout, r.stdout + r.stderr
    assert f"raised at {f}:{line} in KvPool.alloc" in r.stdout, r.stdout


UNSANDBOXED = (f"note: the learner's code runs UNSANDBOXED here ({sandbox.ENV_SANDBOX}=off): it can read and write what "
               "you can; time, memory and process limits still hold")


@pytest.fixture
def no_sandbox(monkeypatch):
    """The path of a machine without a working bubblewrap (macOS, no user namespaces): TL_LAB_SANDBOX=off, and
    this process has not said so yet."""
    monkeypatch.setenv(sandbox.ENV_SANDBOX, "off")
    monkeypatch.setattr(sandbox, "_said", set())
    assert sandbox.bwrap() is None


def test_every_path_that_runs_a_learners_code_says_once_that_it_is_unsandboxed(tmp_path, no_sandbox, capsys, monkeypatch):
    """Issue #61: "the check still runs, says once that it is unsandboxed, and keeps the process and resource
    limits". The notebook guard, parity and try said nothing (and check neither): each path now says it, in
    one line, the same words (sandbox.say_unsandboxed), once a process."""
    from conftest import workspace
    from tl_lab.lab.exercise import guard, parity, tries

    ws = workspace(tmp_path, "reference", ["kv", "quant", "sample"])
    said = []
    for name, go in [("guard", lambda: guard.trial(ws, ["quant"]) == {}),
                     ("parity", lambda: parity.in_child(ws, ["rng"])[0] == 0),
                     ("try", lambda: tries.try_piece("quant.f32_to_f16", ws).passed)]:
        monkeypatch.setattr(sandbox, "_said", set())
        assert go(), name
        assert go(), name  # twice: said once
        err = capsys.readouterr().err
        said.append((name, err.count(UNSANDBOXED), [s for s in err.splitlines() if "UNSANDBOXED" in s]))
    assert said == [(name, 1, [UNSANDBOXED]) for name in ("guard", "parity", "try")]
    r = _check(tmp_path / "ws", "kv", timeout=300)  # the command: on its stderr, once (its run's own goes to the log)
    assert r.returncode == 0 and r.stderr.count(UNSANDBOXED) == 1 and UNSANDBOXED not in r.stdout, r.stdout + r.stderr


def test_unsandboxed_runs_keep_their_bounds(tmp_path, no_sandbox, capsys):
    """Without bubblewrap the time limit, the output cap and the whole group's end still hold."""
    r = sandbox.run([sys.executable, "-c", "import sys, time\nsys.stdout.write('x' * 3000)\nsys.stdout.flush()\ntime.sleep(60)"],
                    workspace=tmp_path, timeout=2, output_cap=1000)
    assert r.timed_out and not r.sandboxed and r.stdout.startswith("x" * 1000) and "2000 bytes more not kept" in r.stdout
    assert "TL_LAB_SANDBOX=off" in r.note and capsys.readouterr().err == UNSANDBOXED + "\n"


def test_a_loop_in_the_learners_code_is_named_at_its_line(tmp_path):
    """Issue #61: a kv.py that loops forever (at its top level, or in a piece) was stopped, and named by its
    file alone: the loop runs in the sandboxed child, stopped from the tests' process. The child now dumps its
    stack (faulthandler) a little before the limit, and the row names the line (sandbox.stuck_at)."""
    from tl_lab.lab.exercise.stubs import reference_source

    f, text = tmp_path / "kv.py", reference_source("kv")
    f.write_text(text + "\ni = 0\nwhile True:\n    i += 1\n", encoding="utf-8")
    r = _check(tmp_path, timeout=3)  # the collection's limit: COLLECT_FLOOR (30 s)
    assert r.returncode == 1 and "kv       does not import" in r.stdout, r.stdout + r.stderr
    lines = {text.count("\n") + 3, text.count("\n") + 4}  # the while, or its body
    assert any(f"{f}:{n}: E   TestTimeout: importing the modules ran longer than" in r.stdout for n in lines), r.stdout
    f.write_text(text.replace("    def alloc(self", "    def alloc(self, *a, **k):\n        while True:\n            pass\n\n"
                              "    def _was_alloc(self", 1), encoding="utf-8")
    line = text[: text.index("    def alloc(self")].count("\n") + 2
    r = _check(tmp_path, timeout=3)
    assert r.returncode == 1 and "TestTimeout: the test ran longer than 3 s" in r.stdout, r.stdout + r.stderr
    assert any(f"stopped at {f}:{n} in KvPool.alloc" in r.stdout for n in (line, line + 1)), r.stdout


def test_stuck_at_reads_the_learners_innermost_frame_of_the_last_dump(tmp_path):
    f = tmp_path / "kv.py"
    f.write_text("class KvPool:\n    def alloc(self):\n        while True:\n            pass\n", encoding="utf-8")
    dump = ("Timeout (0:00:01)!\nThread 0x1 (most recent call first):\n  File \"/elsewhere.py\", line 9 in f\n"
            "Timeout (0:00:02)!\nThread 0x1 (most recent call first):\n  File \"/numpy/x.py\", line 5 in g\n"
            f"  File \"{f}\", line 4 in alloc\n  File \"{f}\", line 9 in <module>\n")
    assert sandbox.stuck_at(dump, [f]) == (str(f), 4, "KvPool.alloc")
    assert sandbox.stuck_at(dump.replace("line 4 in alloc", "line 4 in <module>"), [f]) == (str(f), 4, "(import)")
    assert sandbox.stuck_at(dump, [tmp_path / "other.py"]) is None and sandbox.stuck_at("", [f]) is None


def test_try_names_the_line_a_learners_module_loops_at(tmp_path):
    """Issue #61: `exercise try` of a module that loops at its import said "ran longer than 60 s" alone;
    now the file and line too (the child's stack, dumped a little before its limit)."""
    from conftest import workspace
    from tl_lab.lab.exercise.stubs import reference_source
    from tl_lab.lab.exercise.tries import try_piece

    ws = workspace(tmp_path, "reference", ["quant"])
    text = reference_source("quant") + "\nwhile True:\n    pass\n"
    (ws / "quant.py").write_text(text, encoding="utf-8")
    res = try_piece("quant.f32_to_f16", ws, seconds=4)
    n = text.count("\n")
    assert not res.passed and any(f"ran longer than 4 s at {ws / 'quant.py'}:{k} in (import)" in res.note
                                  for k in (n - 1, n)), res.note


def test_each_is_one_request_with_the_loops_answers_its_first_error_and_its_calls_logged(tmp_path):
    """`remote.each(fn, args)`: a test's loop over scalar calls of the learner's function, run in the child in
    one request (quant's graded tests made 200,000 requests, 55 s a check); the answers are the loop's, of
    the same numpy types, the first exception ends it as the loop's would, and the calls are logged for the
    report as the loop's were."""
    import numpy as np

    from tl_lab.lab.exercise.remote import Connection, each
    from tl_lab.lab.exercise.stubs import reference_source
    from tl_lab.quant import f32_to_f16_scalar

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "quant.py").write_text(reference_source("quant") + "\n\ndef _odd(x):\n    if x == 3:\n"
                                 "        raise ValueError('three')\n    return x\n")
    conn = Connection(ws, ["quant"], "quant", 60)
    sent = []
    request = conn._request
    conn._request = lambda *req: (sent.append(req[0]), request(*req))[1]
    try:
        conn.request("import", "quant")
        f, odd = conn.request("modattr", "quant", "f32_to_f16_scalar"), conn.request("modattr", "quant", "_odd")
        xs = [0.1, 1.0, 65520.0, float("nan"), -0.0] * 100
        conn.record(True)
        sent.clear()
        got = each(f, xs)
        assert sent == ["map"], sent
        want = [f32_to_f16_scalar(x) for x in xs]
        assert [type(g) for g in got] == [type(w) for w in want] and [int(g) for g in got] == [int(w) for w in want]
        logged = conn.record(False)
        assert len(logged) == 200 and {c["piece"] for c in logged} == {"quant.f32_to_f16_scalar"}
        with pytest.raises(ValueError, match="three"):
            each(odd, [1, 2, 3, 4])
        assert each(odd, []) == [] and each(lambda x: x + 1, np.arange(3)) == [1, 2, 3]
    finally:
        conn.close()


def test_a_fresh_workspace_loads_the_kernels_set_up_compiled_instead_of_compiling_them(tmp_path):
    """Under NUMBA_CACHE_DIR numba reads only that folder, so a fresh workspace's first check compiled
    every kernel again (85 s against 31 s on processor E). numba_cache() copies set-up's machine code in:
    a sandboxed child finds a kernel there (a cache hit, no compile). A file already there is not
    replaced, and a subfolder that is a link is not written through."""
    import shutil

    import numpy as np
    from numba.core.caching import _CacheLocator

    from tl_lab.ops import kernels

    kernels.exp_f64(np.zeros(2), np.empty(2))  # in set-up's cache, as after set-up
    sub = _CacheLocator.get_suitable_cache_subpath(kernels.__file__)
    ws = tmp_path / "ws"
    cache = sandbox.numba_cache(ws)
    assert cache == ws / ".tl_lab" / "numba-cache" and any((cache / sub).glob("kernels.exp_f64-*.nbi"))
    code = ("import numpy as np\nfrom tl_lab.ops import kernels\n"
            "kernels.exp_f64(np.zeros(2), np.empty(2))\n"
            "print(len(kernels.exp_f64.stats.cache_hits), len(kernels.exp_f64.stats.cache_misses))\n")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache), "PYTHONPATH": str(REPO_ROOT)}
    r = sandbox.run([sys.executable, "-c", code], workspace=ws, writable=[cache], timeout=120, env=env)
    assert r.returncode == 0 and r.stdout.split() == ["1", "0"], r.stdout + r.stderr

    kept = next((cache / sub).glob("kernels.exp_f64-*.nbi"))
    kept.write_bytes(b"the learner's own")
    assert sandbox.seed_numba_cache(cache) == 0 and kept.read_bytes() == b"the learner's own"

    other = tmp_path / "elsewhere"
    other.mkdir()
    shutil.rmtree(cache / sub)
    (cache / sub).symlink_to(other)
    assert sandbox.seed_numba_cache(cache) == 0 and list(other.iterdir()) == []
