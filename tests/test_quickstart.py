"""`bash tools/quickstart.sh lab` as a learner runs it (issue 11, item 4, and the second-run reinstall).

The lab must be rooted at the repository (tl_lab/, docs/ and tests/ reachable, terminals starting there)
and open notebooks/00_start_here.ipynb; a second run must not reinstall anything. The test runs the real
command against the venv running these tests (TL_LAB_VENV=sys.prefix), asks the server over its REST API,
then stops it by its process group. It never installs: a venv quickstart did not build makes it fail first.
"""

import hashlib
import importlib.metadata
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tl_lab.engine.fetch import smollm2_dir
from tl_lab.ops.paths import REPO_ROOT

FIRST_NOTEBOOK = "/lab/tree/notebooks/00_start_here.ipynb"
START_SECONDS = 60 + 3 * 60  # the fetch check, the kernels' compile the first time (tl_lab.lab.warm: about 90 s; a
# stamp skips it after), then JupyterLab's start: a few seconds on a quiet machine once compiled


def _want_stamp() -> str:
    """What quickstart.sh writes to $VENV/.tl_lab-installed: sha256 of requirements.lock then pyproject.toml."""
    data = (REPO_ROOT / "requirements.lock").read_bytes() + (REPO_ROOT / "pyproject.toml").read_bytes()
    return hashlib.sha256(data).hexdigest()


def _require_quickstart_venv() -> Path:
    """The venv of this interpreter, if quickstart built it from today's lock; else fail saying what to run.

    Checked here, before the command starts, so that the command can never install into a developer's venv.
    """
    venv = Path(sys.prefix)
    run_first = f"run `TL_LAB_VENV={venv} bash tools/quickstart.sh test` first (it installs from the lock)"
    if sys.prefix == sys.base_prefix:
        pytest.fail(f"this test needs to run inside a venv made by tools/quickstart.sh, not {venv}; {run_first}",
                    pytrace=False)
    stamp = venv / ".tl_lab-installed"
    have = stamp.read_text().strip() if stamp.is_file() else None
    if have != _want_stamp():
        why = "no stamp" if have is None else "a stamp for another requirements.lock/pyproject.toml"
        pytest.fail(f"{stamp}: {why}, so quickstart would reinstall; {run_first}", pytrace=False)
    for dist in ("tl_lab", "jupyterlab"):  # quickstart's own "installed" check
        try:
            importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pytest.fail(f"{dist} is not installed in {venv}; {run_first}", pytrace=False)
    if smollm2_dir(quiet=True) is None:  # otherwise the command would download the model
        pytest.fail("SmolLM2 is not in the cache; run `python -m tl_lab fetch smollm2` first", pytrace=False)
    return venv


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, token: str):
    """(status, final URL, body) of a GET with the token, following redirects; HTTP errors are answers too."""
    req = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.geturl(), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.geturl(), exc.read()


def _wait_for_server(proc, base: str, token: str, log: Path) -> None:
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"quickstart.sh lab exited with {proc.returncode}:\n{log.read_text()}", pytrace=False)
        try:
            if _get(base + "/api/status", token)[0] == 200:
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass  # not listening yet
        time.sleep(0.5)
    pytest.fail(f"no /api/status within {START_SECONDS} s:\n{log.read_text()}", pytrace=False)


def _stop(proc) -> None:
    """SIGTERM to the command's process group (JupyterLab and its kernels); then check nothing is left."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            pytest.fail("JupyterLab ignored SIGTERM for 30 s (killed)", pytrace=False)
    try:
        os.killpg(proc.pid, 0)
    except ProcessLookupError:
        return
    os.killpg(proc.pid, signal.SIGKILL)
    pytest.fail("processes of the lab command outlived it (killed)", pytrace=False)


@pytest.fixture
def lab(tmp_path):
    """The running `quickstart.sh lab`: (base URL, token, log file). Stopped after the test."""
    venv = _require_quickstart_venv()
    port, token = _free_port(), secrets.token_hex(16)
    log = tmp_path / "quickstart.log"
    env = dict(os.environ, TL_LAB_VENV=str(venv),
               JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),            # server files away from ~/.local
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"))
    cmd = ["bash", "tools/quickstart.sh", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           f"--IdentityProvider.token={token}", "--ServerApp.port_retries=0"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_for_server(proc, base, token, log)
        yield base, token, log
    finally:
        _stop(proc)


@pytest.mark.smollm2  # the command's fetch step finds the model in the cache (else it would download it)
def test_quickstart_lab_is_rooted_at_the_repository_and_opens_the_first_notebook(lab):
    base, token, log = lab
    for path in ("tl_lab/kv.py", "docs/cli.md", "tests", "notebooks/00_start_here.ipynb"):
        status = _get(f"{base}/api/contents/{path}?content=0", token)[0]
        assert status == 200, f"/api/contents/{path} answered {status}: the lab is not rooted at the repository"
    top = {entry["name"] for entry in json.loads(_get(f"{base}/api/contents", token)[2])["content"]}
    assert {"tl_lab", "docs", "tests", "notebooks", "tools"} <= top, f"the lab's root holds {sorted(top)}"

    status, final, _ = _get(base + "/", token)
    assert status == 200 and final.split("?")[0] == base + FIRST_NOTEBOOK, f"/ led to {final} ({status})"

    out = log.read_text()
    assert "dependencies already installed" in out, f"the lab command did not skip the install:\n{out}"
    assert "installing the locked dependencies" not in out, f"the lab command reinstalled:\n{out}"


def test_the_lab_command_compiles_the_kernels_and_turns_the_news_off():
    """Issue 59: the lab command compiles the kernels during set-up with a line saying so (not in
    silence under the first notebook), and JupyterLab's "get notified about Jupyter news?" pop-up does
    not cover the widgets (news and update checks off, as tests/lab_harness.py has them)."""
    text = (REPO_ROOT / "tools" / "quickstart.sh").read_text()
    lab = text[text.index('if [ "$mode" = lab ]'):]
    warm = text.index("python -m tl_lab.lab.warm")  # before the lab opens and before the tests run, not for hf
    assert text.rfind('if [ "$mode" != hf ]', 0, warm) > text.rfind("fi\n", 0, warm)
    assert warm < text.index("exec jupyter lab") and warm < text.index("exec python -m pytest --nbval-lax")
    assert "--LabApp.news_url=None" in lab and '"fetchNews": "false"' in lab


def test_warm_says_what_it_compiles_for_and_skips_a_second_time(monkeypatch, tmp_path, capsys):
    from tl_lab.lab import warm

    monkeypatch.setattr(warm, "stamp_path", lambda: tmp_path / "stamp")
    assert not warm.compiled() and "not compiled" in warm.note()
    monkeypatch.setattr(warm, "warm", lambda: (tmp_path / "stamp").write_text(warm.stamp_text()) and 1.0)
    assert warm.main() == 0 and "compiling the kernels for this processor, once: about" in capsys.readouterr().out
    assert warm.compiled() and warm.note() is None
    assert warm.main() == 0 and "already compiled" in capsys.readouterr().out
