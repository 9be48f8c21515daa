"""Issue #61's probes: a careless or hostile learner's workspace, and what `exercise check` / `reset` do with it.

    python benchmarks/bench_exercise_probes.py --repo /path/to/clone --out benchmarks/results/exercise-probes-after.json

Each probe makes a workspace in a temporary folder, runs one command of the clone given (`--repo`: the code under
test, so the same script measures the code before and after a change), and records: the exit code, the
number of output lines, the seconds, the peak memory of the command's processes (RUSAGE_CHILDREN, KB), whether
anything outside the workspace changed (the clone's tracked files, a file a link points at) and whether a
process of the probe is left running afterwards. Each command runs under a wall limit (`--limit`, 120 s: a
"hang" is a command still running at it, then killed with its process group), and, to keep the machine safe,
RLIMIT_AS 6 GB and RLIMIT_FSIZE 512 MB (a flood stops at the file-size limit instead of filling the disk).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MARK = "tl-probe-i61-marker"


def stub(repo: Path, module: str) -> str:
    out = subprocess.run([sys.executable, "-c", f"from tl_lab.lab.exercise.stubs import stub_source; "
                          f"print(stub_source({module!r}), end='')"], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(repo), "TL_LAB_WORKSPACE": "off"}, cwd=repo)
    return out.stdout


def setup(name: str, ws: Path, outside: Path, repo: Path) -> list[str]:
    """Fill workspace `ws` for probe `name`; -> the command's arguments after `python -m tl_lab`."""
    kv = stub(repo, "kv")
    check = ["exercise", "check", "kv", "--workspace", str(ws), "--timeout", "30"]
    cheats = {
        "cheat_runtest": "import _pytest.python\n_pytest.python.Function.runtest = lambda self: None\n",
        "cheat_writer": "import tl_lab.lab.exercise.plugin as p\np._write = lambda: None\n",
        "cheat_atexit": ("import atexit, json, os\ndef forge():\n    r = os.environ.get('TL_LAB_EXERCISE_REPORT')\n"
                         "    if r:\n        open(r, 'w').write(json.dumps({'grade': 'kv', 'errors': [], 'origins': {},"
                         " 'results': []}))\natexit.register(forge)\n"),
        "cheat_rewrites_tests": (f"from pathlib import Path\np = Path({str(repo / 'tests' / 'test_kv.py')!r})\n"
                                 "try:\n    p.write_text(p.read_text() + '\\n# rewritten\\n')\nexcept OSError:\n    pass\n"),
        "print_flood_at_import": "while True:\n    print('x' * 1000)\n",
        "fork_at_import": f"import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(600)  # {MARK}\n",
        "loop_ignoring_alarm": "import signal, time\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True:\n    time.sleep(1)\n",
    }
    if name in cheats:
        (ws / "kv.py").write_text(kv + "\n" + cheats[name])
        return check
    if name == "fifo_kv":
        os.mkfifo(ws / "kv.py")
        return check
    if name == "devzero_kv":
        os.symlink("/dev/zero", ws / "kv.py")
        return check
    if name == "status_tmp_link":
        (ws / "kv.py").write_text(kv)
        (ws / ".tl_lab").mkdir()
        os.symlink(outside, ws / ".tl_lab" / "status.tmp")
        return check
    if name == "corrupt_status":
        (ws / "kv.py").write_text(kv)
        (ws / ".tl_lab").mkdir()
        (ws / ".tl_lab" / "status.json").write_text("[1, 2]")
        return ["exercise", "status", "--workspace", str(ws)]
    if name == "reset_in_package":
        return ["exercise", "reset", "kv", "--workspace", str(repo / "tl_lab")]
    if name == "timeout_1e10":
        (ws / "kv.py").write_text(kv)
        return ["exercise", "check", "kv", "--workspace", str(ws), "--timeout", "1e10"]
    raise KeyError(name)


PROBES = ["cheat_runtest", "cheat_writer", "cheat_atexit", "cheat_rewrites_tests", "fifo_kv", "devzero_kv",
          "status_tmp_link", "corrupt_status", "print_flood_at_import", "fork_at_import", "reset_in_package",
          "timeout_1e10", "loop_ignoring_alarm"]


WATCHED = ["tests/test_kv.py", "tests/conftest.py", "tl_lab/kv.py", "tl_lab/__init__.py"]


def tracked_state(repo: Path) -> str:
    """The files a probe could change outside its workspace (not `git status`: others may edit the clone)."""
    import hashlib

    return " ".join(hashlib.sha256((repo / f).read_bytes()).hexdigest() if (repo / f).is_file() else "missing"
                    for f in WATCHED)


def _limits():
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
    resource.setrlimit(resource.RLIMIT_FSIZE, (512 << 20, 512 << 20))


def stray() -> int:
    out = subprocess.run(["pgrep", "-f", MARK], capture_output=True, text=True).stdout.split()
    return len(out)


def run_probe(name: str, repo: Path, limit: float) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"probe-{name}-") as d:
        ws, outside = Path(d) / "ws", Path(d) / "outside.txt"
        ws.mkdir()
        outside.write_text("untouched\n")
        args = setup(name, ws, outside, repo)
        before = tracked_state(repo)
        env = {**os.environ, "PYTHONPATH": str(repo)}
        env.pop("TL_LAB_WORKSPACE", None)
        t0 = time.perf_counter()
        with tempfile.TemporaryFile() as out:
            p = subprocess.Popen([sys.executable, "-m", "tl_lab", *args], cwd=repo, env=env, stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_limits)
            try:
                code = p.wait(timeout=limit)
                hung = False
            except subprocess.TimeoutExpired:
                hung, code = True, None
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
            p.wait()
            seconds = time.perf_counter() - t0
            out.seek(0)
            text = out.read(4 << 20).decode("utf-8", "replace")
        time.sleep(0.5)
        left = stray()
        if left:
            subprocess.run(["pkill", "-9", "-f", MARK])  # the probe's own marker, nothing else
        after = tracked_state(repo)
        changed_outside = outside.read_text() != "untouched\n" or after != before
        if after != before:
            subprocess.run(["git", "checkout", "--", *WATCHED], cwd=repo)
        return {"probe": name, "exit": code, "hung": hung, "lines": text.count("\n"), "seconds": round(seconds, 1),
                "peak_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
                "changed_outside": changed_outside, "processes_left": left,
                "last_line": (text.strip().splitlines() or [""])[-1][:200]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", type=Path, default=Path(__file__).resolve().parent.parent)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--limit", type=float, default=120.0)
    ap.add_argument("--only", nargs="*")
    a = ap.parse_args()
    rows = []
    for name in a.only or PROBES:
        # each probe in a process of its own, so that peak_kb (RUSAGE_CHILDREN) is that probe's
        r = subprocess.run([sys.executable, __file__, "--repo", str(a.repo), "--limit", str(a.limit), "--out", "-",
                            "--only-one", name] if False else [sys.executable, "-c",
                           f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
                           f"import bench_exercise_probes as b; from pathlib import Path; "
                           f"print(json.dumps(b.run_probe({name!r}, Path({str(a.repo)!r}), {a.limit})))"],
                           capture_output=True, text=True)
        try:
            row = json.loads(r.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            row = {"probe": name, "error": r.stderr[-500:]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"repo": str(a.repo), "commit": subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=a.repo, capture_output=True, text=True).stdout.strip(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S"), "limit": a.limit, "probes": rows}, indent=1))


if __name__ == "__main__":
    main()
