"""What a learner sees: real JupyterLab in Debian's chromium, driven by Playwright.

The server runs on a copy of the notebooks in a scratch folder, so nothing in the repo is written.
Recipe: ../shared/recipes/jupyterlab-in-chromium.md (the flags and selectors measured on these machines).
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import need

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
TOKEN = "tl-lab-test"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_settings(settings: Path) -> None:
    for rel, body in {
        "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false", "checkForUpdates": False},
        "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
    }.items():
        path = settings / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(body))


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on 127.0.0.1 over a scratch copy of notebooks/; yields its base URL."""
    need("jupyterlab")
    scratch = tmp_path_factory.mktemp("lab")
    shutil.copytree(ROOT / "notebooks", scratch / "notebooks")
    _write_settings(scratch / "settings")
    env = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=str(scratch / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(scratch / "workspaces"), JUPYTER_RUNTIME_DIR=str(scratch / "runtime"))
    port = _free_port()
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ip=127.0.0.1", f"--port={port}",
           f"--IdentityProvider.token={TOKEN}", "--ServerApp.port_retries=0", "--LabApp.news_url=None",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
           f"--ServerApp.root_dir={scratch / 'notebooks'}"]
    log = open(scratch / "server.log", "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(f"{base}/api/status?token={TOKEN}", proc, scratch / "server.log")
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _wait_ready(url: str, proc, log: Path, timeout: float = 90) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            pytest.fail(f"jupyter lab exited early:\n{log.read_text()[-3000:]}")
        try:
            if urllib.request.urlopen(url, timeout=2).status == 200:
                return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"jupyter lab did not answer within {timeout}s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def browser():
    sync_api = need("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.fail("these tests need Debian's chromium: apt-get install chromium "
                    "(tools/quickstart.sh test installs it)", pytrace=False)
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        yield b
        b.close()


def _open_and_run_all(browser, lab: str, name: str):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{lab}/lab/tree/{name}?reset&token={TOKEN}")
    page.wait_for_selector(".jp-NotebookPanel .jp-Notebook .jp-Cell", timeout=60_000)
    _wait_idle(page)
    page.click("text=Run")  # the menu bar item
    page.click('li.lm-Menu-item[data-command="runmenu:run-all"]')
    page.wait_for_timeout(1000)
    _wait_idle(page, timeout=120_000)
    return page


def _wait_idle(page, timeout: int = 60_000) -> None:
    page.wait_for_function(
        """() => {
            const items = [...document.querySelectorAll('#jp-main-statusbar .jp-StatusBar-TextItem')];
            const i = document.querySelector('.jp-Notebook-ExecutionIndicator');
            return items.some(s => /\\| Idle$/.test(s.textContent.trim())) && i && i.dataset.status === 'idle';
        }""",
        timeout=timeout,
    )


def _errors(page) -> list[str]:
    return page.eval_on_selector_all(
        '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"], .jp-RenderedText[data-mime-type="application/vnd.jupyter.error"]',
        "els => els.map(e => e.textContent.slice(0, 500))",
    )


def test_start_here_runs_in_a_real_browser(lab, browser):
    page = _open_and_run_all(browser, lab, "00_start_here.ipynb")
    assert not [e for e in _errors(page) if "Error" in e], _errors(page)
    # the walkthrough table rendered as a real table with a link per notebook
    links = page.eval_on_selector_all(".jp-RenderedMarkdown table a", "els => els.map(e => e.textContent)")
    assert "07_sampler" in links and "04_kv_pool" in links
    page.close()


def test_sampler_playground_reacts_to_a_slider_in_the_browser(lab, browser):
    """Move the top-k slider with the keyboard; the kernel's new kept set must appear on the page.

    The section-3 example (top-k 3, top-p 0.8, seed 0) keeps {1, 3}; top-k 4 lets id 2 into the
    nucleus (q1 + q3 = 0.799 < 0.8), so only a wired observer can show {1, 2, 3}.
    """
    page = _open_and_run_all(browser, lab, "07_sampler.ipynb")
    assert not [e for e in _errors(page) if "Error" in e], _errors(page)
    token = page.locator(".tl-token").first
    token.scroll_into_view_if_needed()
    assert "kept 2 of 5: {1, 3}" in token.text_content()
    slider = page.locator(".widget-slider").filter(has_text="top-k").first
    handle = slider.locator(".noUi-handle")
    handle.focus()
    handle.press("ArrowRight")
    assert slider.locator(".widget-readout").text_content().strip() == "4"
    page.wait_for_function(
        "() => document.querySelector('.tl-token').textContent.includes('kept 3 of 5: {1, 2, 3}')", timeout=30_000
    )
    assert "token 3" in token.text_content()
    page.close()
