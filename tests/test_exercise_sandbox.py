"""Issue #61: the verdict is computed where the learner's code never runs, and the learner's code runs sandboxed.

Each cheat below passed `exercise check kv` (exit 0) before: an untouched stub plus a few lines that patch
pytest, the plugin's writer or the report, or that rewrite the graded tests. Now the tests run in a process
that never imports the learner's file (tl_lab.exercise.remote), so each of them fails its check."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tl_lab.exercise import sandbox
from tl_lab.exercise.stubs import stub_source
from tl_lab.exercise.workspace import REPO_ROOT

CHEATS = {
    "runtest": "import _pytest.python\n_pytest.python.Function.runtest = lambda self: None\n",
    "writer": "import tl_lab.exercise.plugin as p\np._write = lambda: None\n",
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


def _check(ws: Path, module: str = "kv") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TL_LAB_WORKSPACE"}
    env["PYTHONPATH"] = str(REPO_ROOT)
    return subprocess.run([sys.executable, "-m", "tl_lab", "exercise", "check", module, "--workspace", str(ws),
                           "--timeout", "60"], capture_output=True, text=True, env=env, timeout=600, cwd=REPO_ROOT)


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
