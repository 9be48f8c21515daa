"""One notebook in one python3 kernel, driven by nbclient as a learner drives JupyterLab: Run All, then
single cells run again, in the same kernel. Used by tests/test_notebooks.py (pictures, re-runs) and
benchmarks/bench_notebooks.py (Run All times, the kernel's memory).

    with NotebookKernel("05_forward.ipynb") as k:
        seconds = k.run_all()
        k.run_again(12)            # cell 12 once more, on the state Run All left
        k.rss_mb(), k.live_mb()    # the kernel's memory, and what it holds once freed pages are given back

The kernel's working directory is notebooks/, as in JupyterLab; PYTHONPATH is inherited, so a
worktree's tl_lab is the one imported.
"""

from __future__ import annotations

import contextlib
import copy
import re
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NB_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(p.name for p in NB_DIR.glob("[0-9][0-9]_*.ipynb"))
KERNEL_LOGS = Path(tempfile.gettempdir()) / "tl_lab-kernels"
CELL_TIMEOUT = 600  # seconds; the slowest cell (10's pitfall checks on a busy machine) takes about a minute


class NotebookKernel:
    """notebooks/`name` and a fresh python3 kernel for it; `nb` holds the outputs of the last Run All."""

    def __init__(self, name: str):
        import nbformat
        from nbclient import NotebookClient

        self.name = name
        self.nb = nbformat.read(NB_DIR / name, as_version=4)
        self.client = NotebookClient(self.nb, kernel_name="python3", timeout=CELL_TIMEOUT,
                                     resources={"metadata": {"path": str(NB_DIR)}})
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> NotebookKernel:
        # The kernel's own output (its start-up warnings, a crash's traceback) goes to a file, not to the
        # terminal: a kernel started from a thread (test_notebooks runs several at a time) printed over
        # pytest's report whenever its capture was paused. The file stays where the block using the kernel
        # raised, for the reason, and goes otherwise.
        KERNEL_LOGS.mkdir(parents=True, exist_ok=True)
        self.log = tempfile.NamedTemporaryFile("w", prefix=f"{Path(self.name).stem}-", suffix=".log", dir=KERNEL_LOGS,
                                               delete=False)
        self._stack.callback(self.log.close)
        self._stack.enter_context(self.client.setup_kernel(stdout=self.log, stderr=self.log))
        return self

    def __exit__(self, kind, *exc) -> None:
        self._stack.close()
        if kind is None:
            Path(self.log.name).unlink(missing_ok=True)

    def run_all(self) -> float:
        """Every cell in order (CellExecutionError at the first that raises); -> seconds. The
        notebook's widget state is stored in `nb.metadata` as a saved notebook holds it."""
        t0 = time.perf_counter()
        for index, cell in enumerate(self.nb.cells):
            self.client.execute_cell(cell, index)
        seconds = time.perf_counter() - t0
        self.client.set_widgets_metadata()
        return seconds

    def run_again(self, index: int):
        """Code cell `index` once more, on whatever state the kernel holds; -> the re-run cell (its
        outputs). The outputs Run All left in `nb` are kept (execute_cell writes the cell back)."""
        kept = self.nb.cells[index]
        try:
            return self.client.execute_cell(copy.deepcopy(kept), index)
        finally:
            self.nb.cells[index] = kept

    def helper(self, source: str) -> list:
        """Run `source` in the kernel outside the notebook and its history; -> its outputs."""
        import nbformat

        self.nb.cells.append(nbformat.v4.new_code_cell(source))
        try:
            return self.client.execute_cell(self.nb.cells[-1], len(self.nb.cells) - 1, store_history=False).outputs
        finally:
            self.nb.cells.pop()

    def printed(self, source: str) -> str:
        """What `source` prints in the kernel."""
        return "".join(o.get("text", "") for o in self.helper(source) if o.get("output_type") == "stream")

    def rss_mb(self) -> float:
        """The kernel's resident memory now, in MiB (Linux: /proc/self/statm)."""
        return float(self.printed("import resource as _r\n"
                                  "print(int(open('/proc/self/statm').read().split()[1]) * _r.getpagesize() / 2**20)"))

    def live_mb(self) -> float:
        """The kernel's resident memory after gc.collect() and, under glibc, malloc_trim(0), in MiB: what
        the kernel still holds. The difference from rss_mb() is memory already freed that glibc's malloc
        keeps for reuse (the free pages inside its heaps, given back only by a trim); on another libc,
        only the collect."""
        self.helper("import ctypes as _c, gc as _g\n_g.collect()\n"
                    "try:\n    _c.CDLL('libc.so.6').malloc_trim(0)\nexcept (OSError, AttributeError):\n    pass")
        return self.rss_mb()


def first_line(cell) -> str:
    return cell.source.strip().splitlines()[0] if cell.source.strip() else ""


def error_line(exc: Exception) -> str:
    """The exception line of a CellExecutionError (its text ends with the kernel's traceback), after the
    cell's line that raised it (an AssertionError alone says nothing)."""
    lines = [ln for ln in re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip().splitlines() if ln.strip()]
    if not lines:
        return repr(exc)
    arrows = [ln.strip() for ln in lines if ln.lstrip().startswith("---->")]
    return (f"{arrows[-1][:200]}  ->  " if arrows else "") + lines[-1][:300]
