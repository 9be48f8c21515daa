"""Drive real JupyterLab in a headless chromium or Chrome: one server, notebooks opened, Run All, widgets played with.

Used by tests/test_browser.py (the browser suite) and tools/screenshots.py (the README's pictures), so
both see exactly what a learner sees. The server runs on a scratch copy of notebooks/, so nothing in the
repository is written. Recipe: /work/shared/recipes/jupyterlab-in-chromium.md (flags and selectors
measured on these machines).

    with Lab(scratch) as lab, chromium() as browser:
        page = lab.open(browser, "07_sampler.ipynb")
        lab.run_all(page)
        act(page, Act("pg = SamplerPlayground(yours=", "slider", "top-k", watch=".tl-token", expect="{1, 2, 3}"))
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Where a chromium or Chrome may be, in the order tried (find_browser): $TL_LAB_CHROMIUM, then these
# names on PATH (Debian's chromium first: the one measured here), then macOS's application bundles,
# then the browser Playwright downloads (`python -m playwright install chromium`).
BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
BROWSER_APPS = ("/Applications/Chromium.app/Contents/MacOS/Chromium",
                "/Applications/Google Chrome.app/Contents/MacOS/Google Chrome")
NO_BROWSER = ("no chromium or Chrome found (tried $TL_LAB_CHROMIUM, " + ", ".join(BROWSER_NAMES) + " on PATH, "
              "the macOS apps and Playwright's own): install one (Debian/Ubuntu: apt-get install chromium; "
              "anywhere: python -m playwright install chromium) or set TL_LAB_CHROMIUM=/path/to/it")
TOKEN = "tl-lab-test"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SETTINGS = {
    # a news pop-up would cover outputs; autosave would write outputs into the notebook under test;
    # windowing would detach cells outside the viewport (a widget far down would not be in the page)
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}
VIEWPORT = {"width": 1400, "height": 1600}  # tall enough for a whole playground in a screenshot


class LabError(RuntimeError):
    """The server or the page did not do what a learner would see it do."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab:
    """A JupyterLab server on 127.0.0.1 over `scratch`/notebooks (a copy of notebooks/)."""

    def __init__(self, scratch: Path):
        self.scratch = Path(scratch)
        self.proc: subprocess.Popen | None = None
        self.base = ""

    def __enter__(self) -> Lab:
        nb = self.scratch / "notebooks"
        shutil.rmtree(nb, ignore_errors=True)
        shutil.copytree(ROOT / "notebooks", nb, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
        for rel, body in SETTINGS.items():
            path = self.scratch / "settings" / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(body))
        s = self.scratch
        env = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=str(s / "settings"), JUPYTER_RUNTIME_DIR=str(s / "runtime"),
                   JUPYTERLAB_WORKSPACES_DIR=str(s / "workspaces"),
                   PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
        port = free_port()
        cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ip=127.0.0.1", f"--port={port}",
               f"--IdentityProvider.token={TOKEN}", "--ServerApp.port_retries=0", "--LabApp.news_url=None",
               "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate", f"--ServerApp.root_dir={nb}"]
        self._log = open(s / "server.log", "w")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        self.base = f"http://127.0.0.1:{port}"
        try:
            self._wait_ready()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            self.proc = None
        self._log.close()

    def _wait_ready(self, timeout: float = 90) -> None:
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.proc.poll() is not None:
                raise LabError(f"jupyter lab exited early:\n{self.log_tail()}")
            try:
                if urllib.request.urlopen(self.api("status"), timeout=2).status == 200:
                    return
            except OSError:
                time.sleep(0.5)
        raise LabError(f"jupyter lab did not answer within {timeout}s:\n{self.log_tail()}")

    def log_tail(self) -> str:
        return (self.scratch / "server.log").read_text()[-3000:]

    def api(self, path: str) -> str:
        return f"{self.base}/api/{path}?token={TOKEN}"

    # ------------------------------------------------------------ notebooks

    def open(self, browser, name: str, viewport: dict | None = None):
        """A new page with notebook `name` open and its kernel idle. A taller `viewport` lets a
        screenshot hold a widget taller than a screen (the notebook scrolls inside its own panel)."""
        page = browser.new_page(viewport=viewport or VIEWPORT)
        page.goto(f"{self.base}/lab/tree/{name}?reset&token={TOKEN}")
        page.wait_for_selector(".jp-NotebookPanel .jp-Notebook .jp-Cell", timeout=60_000)
        wait_idle(page)
        return page

    def run_all(self, page, timeout_ms: int = 180_000) -> float:
        """Run > Run All Cells, as a learner does; -> seconds until every cell has run."""
        t0 = time.perf_counter()
        page.click("text=Run")  # the menu bar item
        page.click('li.lm-Menu-item[data-command="runmenu:run-all"]')
        page.wait_for_timeout(500)
        wait_idle(page, timeout_ms)
        page.wait_for_function("""() => [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')]
                                   .every(p => /\\[\\d+\\]/.test(p.textContent))""", timeout=timeout_ms)
        return time.perf_counter() - t0

    def kernel_pids(self) -> list[int]:
        """The process ids of the kernels this server runs (for their memory)."""
        import psutil

        return [p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)
                if "ipykernel" in " ".join(p.cmdline())]

    def shutdown_kernels(self) -> None:
        """Stop every kernel (a closed tab keeps its kernel; ten of them would fill the machine)."""
        with urllib.request.urlopen(self.api("kernels"), timeout=10) as r:
            kernels = json.load(r)
        for k in kernels:
            req = urllib.request.Request(self.api(f"kernels/{k['id']}"), method="DELETE")
            urllib.request.urlopen(req, timeout=30).close()


def rss_mb(pid: int) -> float:
    import psutil

    return psutil.Process(pid).memory_info().rss / 2**20


def playwright_chromium() -> str | None:
    """The chromium Playwright downloaded (`python -m playwright install chromium`), if it did."""
    try:
        from playwright.sync_api import sync_playwright

        with sync_playwright() as p:
            path = p.chromium.executable_path
    except Exception:  # no playwright, or no driver: then there is no Playwright browser either
        return None
    return path if path and Path(path).is_file() else None


def find_browser() -> str | None:
    """The chromium or Chrome executable the browser tests drive, or None (order: BROWSER_NAMES' comment)."""
    if os.environ.get("TL_LAB_CHROMIUM"):
        path = os.environ["TL_LAB_CHROMIUM"]
        return path if Path(path).is_file() else None  # a wrong setting is not silently replaced
    for name in BROWSER_NAMES:
        if found := shutil.which(name):
            return found
    for app in BROWSER_APPS:
        if Path(app).is_file():
            return app
    return playwright_chromium()


@contextlib.contextmanager
def chromium():
    """Playwright driving the chromium or Chrome `find_browser` finds, headless."""
    from playwright.sync_api import sync_playwright

    browser = find_browser()
    if browser is None:
        raise LabError(NO_BROWSER)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=browser, headless=True, args=CHROMIUM_FLAGS)
        try:
            yield b
        finally:
            b.close()


def wait_idle(page, timeout: int = 60_000) -> None:
    """The kernel exists and is idle: the status bar AND the execution indicator say so."""
    page.wait_for_function(
        """() => {
            const items = [...document.querySelectorAll('#jp-main-statusbar .jp-StatusBar-TextItem')];
            const i = document.querySelector('.jp-Notebook-ExecutionIndicator');
            return items.some(s => /\\| Idle$/.test(s.textContent.trim())) && i && i.dataset.status === 'idle';
        }""",
        timeout=timeout,
    )


def errors(page) -> list[str]:
    """The text of every error or stderr output on the page."""
    return page.eval_on_selector_all(
        '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"], '
        '.jp-RenderedText[data-mime-type="application/vnd.jupyter.error"]',
        "els => els.map(e => e.textContent.slice(0, 800))",
    )


def cut_labels(page) -> list[str]:
    """Widget labels, checkbox descriptions and buttons whose text does not fit (shown as 'temperature (0 = g...')."""
    return page.eval_on_selector_all(
        ".jp-OutputArea .widget-label, .jp-OutputArea .widget-label-basic, .jp-OutputArea button.jupyter-button",
        "els => els.filter(e => e.offsetParent && e.scrollWidth > e.clientWidth + 1).map(e => e.textContent)",
    )


def sections(page) -> list[dict]:
    """Every code cell on the page in order: {"section": the last markdown heading above it, "index":
    its place among the code cells, "image": whether its output shows a picture (an img, an svg or a
    canvas)}. (Not its source: the editor puts only the lines in view on the page.)"""
    return page.evaluate("""() => {
        let section = '(top)', k = 0;
        const out = [];
        for (const cell of document.querySelectorAll('.jp-Notebook .jp-Cell')) {
            if (cell.classList.contains('jp-MarkdownCell')) {
                const hs = cell.querySelectorAll('.jp-RenderedMarkdown h1, .jp-RenderedMarkdown h2, .jp-RenderedMarkdown h3');
                if (hs.length) section = hs[hs.length - 1].textContent.replace(/¶$/, '').trim();
            } else if (cell.classList.contains('jp-CodeCell')) {
                const image = !!cell.querySelector('.jp-Cell-outputArea img, .jp-Cell-outputArea svg, .jp-Cell-outputArea canvas');
                out.push({section, index: k++, image});
            }
        }
        return out;
    }""")


def shoot_code_cell(page, index: int, path: Path) -> Path:
    """A PNG of the output of the `index`-th code cell."""
    out = page.locator(".jp-CodeCell").nth(index).locator(".jp-Cell-outputArea")
    out.scroll_into_view_if_needed()
    path.parent.mkdir(parents=True, exist_ok=True)
    out.screenshot(path=str(path))
    return path


def cut_off(page, selector: str) -> list[str]:
    """Elements matching `selector` inside outputs that do not fit: wider than their own box (clipped
    or scrolled) or running past the right edge of their output area."""
    return page.eval_on_selector_all(selector, """els => els.filter(e => {
        const area = e.closest('.jp-OutputArea-output');
        const past = area && e.getBoundingClientRect().right > area.getBoundingClientRect().right + 1;
        return e.offsetParent && (e.scrollWidth > e.clientWidth + 1 || past);
    }).map(e => e.textContent.slice(0, 80))""")


def n_widgets(page) -> int:
    """How many widget views the outputs hold (a notebook with widgets needs a table entry)."""
    return page.locator(".jp-OutputArea-output .jupyter-widgets.widget-container, "
                        ".jp-OutputArea-output .jupyter-widgets.widget-inline-hbox").count()


# ---------------------------------------------------------------------------------------------------
# One interaction: what to do to a widget, and what must change on the page


@dataclass(frozen=True)
class Act:
    """In the code cell whose source contains `cell`: do `do` to the control labelled `target`, then the
    text of `watch` (a selector inside that cell's output) must change, and contain `expect` if given.

    do: "slider" (focus the handle, press `value` or ArrowRight), "select" (pick the option `value`),
    "type" (fill the box with `value`, then Tab: a change the kernel sees), "click" (the button).
    """

    cell: str
    do: str
    target: str
    value: str = ""
    watch: str = ".jp-OutputArea-output"
    expect: str = ""

    def label(self) -> str:
        return f"{self.do} {self.target!r}" + (f" = {self.value!r}" if self.value else "")


def code_sources(notebook: str) -> list[str]:
    """The sources of notebooks/<notebook>'s code cells, in order, as the page shows them."""
    cells = json.loads((ROOT / "notebooks" / notebook).read_text(encoding="utf-8"))["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]


def cell_output(page, cell: str):
    """The output area of the code cell whose source contains `cell`."""
    code = page.locator(".jp-CodeCell").filter(has=page.locator(".jp-InputArea", has_text=cell))
    if code.count() != 1:
        raise LabError(f"expected one code cell containing {cell!r}, found {code.count()}")
    return code.locator(".jp-Cell-outputArea")


def control(out, a: Act):
    """The element an Act acts on, inside the output `out`."""
    if a.do == "slider":
        return out.locator(".widget-slider").filter(has_text=a.target).first.locator(".noUi-handle")
    if a.do == "select":
        return out.locator(".widget-dropdown").filter(has_text=a.target).first.locator("select")
    if a.do == "type":
        return out.locator(".widget-text, .widget-textarea").filter(has_text=a.target).first.locator("input, textarea")
    if a.do == "click":
        return out.locator("button").filter(has_text=a.target).first
    raise LabError(f"unknown action {a.do!r}")


def act(page, a: Act, timeout_ms: int = 90_000) -> str:
    """Do `a` and wait until the kernel's answer is on the page; -> the watched text afterwards."""
    from playwright.sync_api import expect

    out = cell_output(page, a.cell)
    watched = out.locator(a.watch).first
    watched.scroll_into_view_if_needed()
    before = watched.text_content()
    el = control(out, a)
    el.scroll_into_view_if_needed()
    if a.do == "slider":
        el.focus()
        el.press(a.value or "ArrowRight")
    elif a.do == "select":
        el.select_option(label=a.value)
    elif a.do == "type":
        el.fill(a.value)
        el.press("Tab")
    else:
        el.click()
    expect(watched).not_to_have_text(before, timeout=timeout_ms)
    if a.expect:
        expect(watched).to_contain_text(a.expect, timeout=timeout_ms)
    return watched.text_content()


def shoot(page, cell: str, path: Path) -> Path:
    """A PNG of the output of the cell whose source contains `cell`."""
    out = cell_output(page, cell)
    out.scroll_into_view_if_needed()
    path.parent.mkdir(parents=True, exist_ok=True)
    out.screenshot(path=str(path))
    return path


if __name__ == "__main__":  # tools/quickstart.sh test: `python tests/lab_harness.py --find-browser`
    if sys.argv[1:] != ["--find-browser"]:
        sys.exit("usage: python tests/lab_harness.py --find-browser")
    found = find_browser()
    print(found or NO_BROWSER, file=sys.stdout if found else sys.stderr)
    sys.exit(0 if found else 1)
