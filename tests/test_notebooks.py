"""The notebooks as a learner uses them, outside the browser: Run All, then look at what it left.

One kernel per notebook (nbclient, kernel python3, cwd notebooks/) serves both checks:
- every code cell that made a matplotlib figure shows a picture: an image/png (or svg) output, or a
  widget whose models hold one (an Output widget's image, an HTML widget's <svg>). The kernel is
  instrumented before Run All: a pre/post-run hook counts the Figures each cell creates, so a figure
  displayed as its text form (`<Figure size 750x320 with 1 Axes>`) is caught;
- re-run safety: after Run All and a learner's use of the widgets (USE), every code cell is executed
  again, one at a time, from the last to the first, on the state Run All left (a cell never sees its own
  set-up re-run first). None may raise, asserts included. A cell that must not be re-run says so in its
  first line (RUN_ONCE); aim for none. Afterwards no tl_lab widget made by an earlier run of its cell is
  still alive (each Run All of 01 once kept its block map, and a copy of the pool, for good);
- memory: the notebooks that make engines, pools and block maps (MEMORY) keep no more memory after a
  third Run All in one kernel than after the second, beyond GROWTH_MB. Live memory is measured (after
  gc.collect() and glibc's malloc_trim(0)), so freed pages malloc keeps for reuse do not count.

nbval (`pytest --nbval-lax notebooks/`) only checks that Run All raises nothing; these checks see what
a learner sees next. Times are printed (`-s`); benchmarks/bench_notebooks.py measures them properly.
"""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest

import platform

from conftest import need
from tl_lab.ops.machine import cores
from notebook_kernel import NB_DIR, NOTEBOOKS, NotebookKernel, error_line, first_line

RUN_ONCE = "# run once"  # a cell's first line starting so is not re-run (none today)

# What a learner does with the widgets between Run All and running cells again (run in the kernel, by
# the widgets' own controls), with the states the widgets must then show. A cell after a widget that
# asserts the widget's first state would fail the re-run here (10_pitfalls once did).
USE = {
    "02_model_directory.ipynb": 'view.dropdown.value = "tiny Llama (int4)"',
    "03_numbers.ipynb": 'numbers.text.value = "65520"',
    "04_kv_pool.ipynb": "bm.next_button.click()",
    "06_int4.ipynb": 'int4_widget.weights_text.value, int4_widget.group.value = "1e-9, 0", "2"\n'
                     'assert int4_widget.view.underflow.all() and not int4_widget.view.broken.any()',
    "07_sampler.ipynb": 'pg.seed.value = "9007199254740993"\nmp.sample_button.click()',
    "10_pitfalls.ipynb": 'lab.picker.value = "s17"\nlab.draw_button.click()',
    "11_interface.ipynb": """run_button.click()
assert f"PASSED: {picker.value}</b>" in verdict.value, verdict.value   # the verdict names its test
picker.index = 1
assert "not run yet" in verdict.value and "PASSED" not in verdict.value, verdict.value   # and goes with it""",
    "12_where_next.ipynb": "steps.next_button.click()",
}

# Run in the kernel before the notebook: count the matplotlib Figures each cell creates, by execution
# count (a Figure made with pyplot or directly, as tl_lab.lab.widgets.pitfalls.draw_probe does).
PROBE = """
def _tl_probe():
    import matplotlib.figure
    made = {"now": 0, "per_cell": {}}
    init = matplotlib.figure.Figure.__init__
    def counting_init(self, *args, **kwargs):
        made["now"] += 1
        init(self, *args, **kwargs)
    matplotlib.figure.Figure.__init__ = counting_init
    def pre(info):
        made["now"] = 0
    def post(result):
        if made["now"]:
            made["per_cell"][result.execution_count] = made["now"]
    get_ipython().events.register("pre_run_cell", pre)
    get_ipython().events.register("post_run_cell", post)
    return made
_tl_made = _tl_probe()
del _tl_probe
"""
REPORT = "import json; print(json.dumps(_tl_made['per_cell']))"
# After the re-runs: the tl_lab widgets still alive that no cell's latest run made (each Run All once
# left 01's block map, with its copy of the pool, alive: tl_lab.lab.widgets.common.CellWidget)
LEFT_ALIVE = """
def _tl_left_alive():
    import gc
    from ipywidgets import Widget
    from tl_lab.lab.widgets import common
    gc.collect()
    latest = {id(w) for _, made in common._MADE.values() for w in made}
    # IPython's output history keeps every cell's result (a cell ending in `lab` keeps that lab, and
    # what it holds, as Out[n]): the learner's to clear (%reset out), not a widget's leak
    held, todo = set(), list(Out.values())
    while todo:
        w = todo.pop()
        if id(w) not in held:
            held.add(id(w))
            todo += common._parts(w) if isinstance(w, Widget) else []
    return sum(isinstance(o, common.CellWidget) and id(o) not in latest | held for o in gc.get_objects())
print(_tl_left_alive())
del _tl_left_alive
"""


@dataclass
class Executed:
    """What one Run All and one re-run of every cell left: per-cell findings and the times."""

    name: str
    figures: int = 0  # matplotlib Figures made during Run All
    missing_pictures: list[str] = field(default_factory=list)
    rerun_errors: list[str] = field(default_factory=list)
    left_alive: int = 0  # tl_lab widgets of earlier runs of their cells, still alive after the re-runs
    run_all_s: float = 0.0
    rerun_s: float = 0.0


def execute(name: str) -> Executed:
    """Run All of notebooks/`name` in a fresh python3 kernel, then re-run every code cell from the
    last to the first in the same kernel; -> what each phase found."""
    need("nbformat")
    need("nbclient")
    from nbclient.exceptions import CellExecutionError

    found = Executed(name)
    with NotebookKernel(name) as k:
        k.helper(PROBE)
        found.run_all_s = k.run_all()
        figures = {int(n): count for n, count in json.loads(k.printed(REPORT)).items()}
        found.missing_pictures = cells_without_picture(k.nb, figures)
        found.figures = sum(figures.values())
        if name in USE:
            try:
                k.helper(USE[name])
            except CellExecutionError as exc:
                found.rerun_errors.append(f"using the widgets ({USE[name].splitlines()[0]!r}): {error_line(exc)}")
        t0 = time.perf_counter()
        for index in reversed(range(len(k.nb.cells))):
            cell = k.nb.cells[index]
            if cell.cell_type != "code" or first_line(cell).startswith(RUN_ONCE):
                continue
            try:
                k.run_again(index)
            except CellExecutionError as exc:
                found.rerun_errors.append(f"cell {index} ({first_line(cell)[:60]!r}): {error_line(exc)}")
        found.rerun_s = time.perf_counter() - t0
        found.left_alive = int(k.printed(LEFT_ALIVE))
    return found


# ------------------------------------------------------------------ what counts as a picture

IMAGE_MIMES = ("image/png", "image/svg+xml")
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def widget_models(nb) -> dict:
    return nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})


def model_shows_image(models: dict, model_id: str, seen: set | None = None) -> bool:
    """Whether widget `model_id` or a widget inside it holds a picture: an Image, an Output whose outputs
    hold an image, an HTML value with an <svg>."""
    seen = set() if seen is None else seen
    if model_id in seen or model_id not in models:
        return False
    seen.add(model_id)
    m = models[model_id]
    state = m.get("state", {})
    if m.get("model_name") == "ImageModel":
        return True
    if m.get("model_name") == "OutputModel" and outputs_show_image(state.get("outputs", []), models):
        return True
    if "<svg" in str(state.get("value", "")) and m.get("model_name", "").startswith("HTML"):
        return True
    children = state.get("children", [])
    return any(model_shows_image(models, c.removeprefix("IPY_MODEL_"), seen) for c in children)


def outputs_show_image(outputs: list, models: dict) -> bool:
    for out in outputs:
        data = out.get("data", {})
        if any(m in data for m in IMAGE_MIMES) or "<svg" in data.get("text/html", ""):
            return True
        if WIDGET_VIEW in data and model_shows_image(models, data[WIDGET_VIEW]["model_id"]):
            return True
    return False


def cells_without_picture(nb, figures: dict[int, int]) -> list[str]:
    """The code cells of executed `nb` that made a figure (`figures`: execution count -> how many) but
    show no image."""
    models = widget_models(nb)
    missing = []
    for index, cell in enumerate(nb.cells):
        n = figures.get(cell.get("execution_count") or -1, 0) if cell.cell_type == "code" else 0
        if n and not outputs_show_image(cell.outputs, models):
            shown = [o.get("data", {}).get("text/plain", o.get("output_type")) for o in cell.outputs][:3]
            missing.append(f"cell {index} ({first_line(cell)[:60]!r}) made {n} figure(s), shows {shown}")
    return missing


# ------------------------------------------------------------------ the tests

SIDE_BY_SIDE = max(1, min(cores(), 4))
"""Notebooks run at a time, each in its own kernel driven from its own thread: one per core this
process may use, at most four (a notebook's kernel works on one core most of the time). On processor
E's two cores this file's Run Alls and re-runs took 168 s one after another, 110 s two at a time."""


@pytest.fixture(scope="module")
def runs(request):
    """name -> the Future of its `execute`, for every notebook a selected test asks for, SIDE_BY_SIDE at
    a time in NOTEBOOKS' order (a `-k` that picks one notebook runs that one only)."""
    wanted = {item.callspec.params["name"] for item in request.session.items if "runs" in getattr(item, "fixturenames", ())}
    with ThreadPoolExecutor(SIDE_BY_SIDE, thread_name_prefix="notebook") as pool:
        yield {n: pool.submit(execute, n) for n in NOTEBOOKS if n in wanted}


def executed(runs: dict[str, Future], name: str) -> Executed:
    """One Run All and re-run per notebook for both tests: each waits for its notebook's."""
    found = runs[name].result()
    print(f"\n{name}: Run All {found.run_all_s:.1f} s, every cell again {found.rerun_s:.1f} s, {found.figures} figures")
    return found


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_every_cell_that_draws_shows_a_picture(runs, name):
    missing = executed(runs, name).missing_pictures
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_every_cell_runs_again_after_run_all(runs, name):
    found = executed(runs, name)
    assert not found.rerun_errors, "\n".join(found.rerun_errors)
    assert found.left_alive == 0, f"{found.left_alive} widgets of earlier runs of their cells are still alive"


# Notebooks whose cells hold the big things (a SmolLM2 engine and block maps with a copy of its pool: 01;
# pools and block maps: 04; engines, runners and a pool per context length: 12), cheap enough for CI: a
# third Run All keeps less than GROWTH_MB more live memory than the second (measured here: 01 +0.5 to
# +1.3, 04 ~0, 12 +2 to +5; a kept pool copy was +22.5). The first Run All is not compared: imports,
# numba's cached kernels and the first step's one-time allocations arrive then. Without glibc's
# malloc_trim, only the collect runs, and freed memory the allocator keeps counts too: the looser bound.
MEMORY = ["01_why_now.ipynb", "04_kv_pool.ipynb", "12_where_next.ipynb"]
GROWTH_MB = 10 if platform.libc_ver()[0] == "glibc" else 40


@pytest.mark.parametrize("name", MEMORY)
def test_run_all_again_keeps_no_more_memory(name):
    need("nbformat")
    need("nbclient")
    live = []
    with NotebookKernel(name) as k:
        for _ in range(3):
            k.run_all()
            live.append(round(k.live_mb(), 1))
    assert live[2] - live[1] < GROWTH_MB, f"{name}: live memory after each Run All {live} MiB (bound +{GROWTH_MB})"


def failing_cells(name: str, first: bool = False) -> list[str]:
    """Run All of notebooks/`name`, going on past a cell that raises, as Run All with "continue on error"
    would (`first`: stopping there); -> for each cell that raised, in order, the title of the heading above
    it ("## 9. The f16 bound (`f16_bound`)" -> "9. The f16 bound": its level and a closing test name in
    backticks left out)."""
    import re

    from nbclient.exceptions import CellExecutionError

    title, failed = None, []
    with NotebookKernel(name) as k:
        for index, cell in enumerate(k.nb.cells):
            if cell.cell_type == "markdown":
                for line in cell.source.splitlines():
                    if line.startswith("#"):
                        title = re.sub(r" \(`[^`]*`\)$", "", line.lstrip("#").strip())
            elif cell.cell_type == "code":
                try:
                    k.client.execute_cell(cell, index)
                except CellExecutionError:
                    failed.append(title)
                    if first:
                        break
    return failed


def failing_sections(name: str) -> set[str]:
    """The numbers of the sections of notebooks/`name` ("9. The f16 bound" -> "9") whose cells raise."""
    return {title.split(".")[0] for title in failing_cells(name)}


FORWARD_PITFALLS = ["s13", "s14", "s15", "s16", "s17", "s20", "s21", "s22"]


@pytest.mark.parametrize("pid", FORWARD_PITFALLS)
def test_each_pitfall_breaks_the_sections_of_05_the_lab_names(pid, monkeypatch):
    """10_pitfalls says where each pitfall shows in the notebooks (the registry's notebook and cell), and
    05_forward's own table says it too (tests/test_pitfalls.py holds the two equal). With the pitfall on
    in the kernel, the sections of 05 whose cells fail are exactly the ones named. Was: s16 was said to
    break no cell of 05 while its section 6 failed (issue 19); the registry left out section 9 (the f16
    bound) for s13, s14, s15, s17 and s20, and 2 (one layer) for s14, s15 and s22. s14 compiles its
    kernels afresh (a numba cache of its own): about 45 s the first time."""
    import re

    from tl_lab.lab import pitfalls as pf

    need("nbformat")
    need("nbclient")
    p = pf.get(pid)
    named = set(re.findall(r"(?:^|[;,(]\s*(?:and\s+)?)(\d+)\. ", p.cell))
    assert p.notebook == "05_forward" and named, (p.notebook, p.cell)
    monkeypatch.setenv("TL_LAB_PITFALL", pid)
    failed = failing_sections(f"{p.notebook}.ipynb")
    assert failed == named, f"{pid} breaks {p.notebook}'s sections {sorted(failed)}, the lab says {p.cell!r}"


OTHER_PITFALLS = ["s01", "s02", "s03", "s04", "s05", "s06", "s07", "s08", "s09", "s10", "s11", "s12", "s18", "s19"]


@pytest.mark.parametrize("pid", OTHER_PITFALLS)
def test_each_other_pitfall_first_breaks_the_section_the_lab_names(pid, monkeypatch):
    """The pitfalls shown outside 05_forward: with the pitfall on in the kernel, the first cell of its
    notebook that fails is under the heading the lab's "where it shows" begins with (docs/pitfalls.md:
    other cells may fail after it; the run stops at the first). About 25 s for the fourteen."""
    from tl_lab.lab import pitfalls as pf

    need("nbformat")
    need("nbclient")
    p = pf.get(pid)
    assert p.notebook != "05_forward" and set(OTHER_PITFALLS) | set(FORWARD_PITFALLS) == set(pf.PITFALLS)
    monkeypatch.setenv("TL_LAB_PITFALL", pid)
    failed = failing_cells(f"{p.notebook}.ipynb", first=True)
    assert failed and failed[0] and p.cell.startswith(failed[0]), (
        f"{pid} first breaks {p.notebook}'s cell under {failed[:1]}, the lab says {p.cell!r}")


def test_the_kernels_a_run_starts_write_their_temporary_folders_inside_the_runs_own():
    """02 and 13 make temporary folders; nbval kills a kernel, so their clean-up never runs. The root
    conftest gives every process the run starts a TMPDIR it removes at the end; this one keeps /tmp."""
    import os
    import subprocess
    import sys
    import tempfile

    child = subprocess.run([sys.executable, "-c", "import tempfile; print(tempfile.gettempdir())"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert child == os.environ["TMPDIR"] and os.path.basename(child).startswith("tl_lab-run-"), child
    assert tempfile.gettempdir() != child


# ------------------------------------------------------------------ the rules a notebook is written to
# (issue 59, docs/dev/conventions.md): read from the .ipynb files, nothing run. A cell keeps one assert per
# fact it teaches, with a message that says what went wrong and what to re-run; a figure's layout is
# checked in tests/test_plots.py through the plot helpers, not in the cell; a visible code cell is short
# (drawing code goes into tl_lab.lab.widgets.plots or a cell marked source_hidden); a notebook is read in one
# sitting; the engineering under the runner is in one optional notebook.

MAX_CELL_LINES = 25
MAX_WORDS = 1500
UNDER_THE_HOOD = "14_under_the_hood.ipynb"
# The words of the engineering (kernels, threads, bandwidth, the machine): only 14 uses them. "kernel" alone
# is Jupyter's (restart the kernel); the compiled ones are "kernels", "a compiled kernel" or tl_lab.ops.kernels.
ENGINEERING = re.compile(r"GFLOP/s|bandwidth|sgemm|roofline|\bBLAS\b|OpenBLAS|blas_threads|\bAVX|\bL1\b|\bL2\b|"
                         r"prefetch|numba|processor|\bthreads?\b|\bkernels\b|compiled kernel|attend_paged|matvec|"
                         r"matmul8|\bLLVM\b|cpu_model", re.I)
LAYOUT = re.compile(r"get_window_extent|canvas\.draw\(\)|\.overlaps\(|count_contains")


def notebook(name: str):
    import nbformat

    return nbformat.read(NB_DIR / name, as_version=4)


def visible(cell) -> bool:
    return not cell.get("metadata", {}).get("jupyter", {}).get("source_hidden", False)


def python_of(cell) -> str:
    """A code cell's source as Python: IPython's %magics and !shell lines blanked."""
    return "\n".join("" if s.lstrip().startswith(("%", "!")) else s for s in cell.source.splitlines())


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_every_assert_in_a_notebook_says_what_went_wrong(name):
    import ast

    bare = []
    for index, cell in enumerate(notebook(name).cells):
        if cell.cell_type == "code":
            for node in ast.walk(ast.parse(python_of(cell))):
                if isinstance(node, ast.Assert) and node.msg is None:
                    bare.append(f"cell {index} line {node.lineno}: {ast.unparse(node.test)[:80]}")
    assert not bare, f"{name}: {len(bare)} asserts without a message:\n" + "\n".join(bare)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_a_cell_keeps_one_assert_for_the_fact_it_teaches(name):
    """More than one assert in a cell is test code in a teaching cell: its other checks print, or live in tests/."""
    import ast

    many = [f"cell {i} ({first_line(c)[:50]!r}): {n} asserts" for i, c in enumerate(notebook(name).cells)
            if c.cell_type == "code"
            for n in [sum(isinstance(x, ast.Assert) for x in ast.walk(ast.parse(python_of(c))))] if n > 1]
    assert not many, f"{name}: cells with more than one assert:\n" + "\n".join(many)


SECTION = re.compile(r"^## (\d+)\. ", re.M)


def sections(name: str) -> dict[str, str]:
    """The numbered sections ("## 3. Title") of notebook `name`: number -> its markdown, heading to next heading."""
    text = "\n".join(c.source for c in notebook(name).cells if c.cell_type == "markdown")
    heads = list(SECTION.finditer(text))
    return {m.group(1): text[m.start():(heads[i + 1].start() if i + 1 < len(heads) else len(text))]
            for i, m in enumerate(heads)}


@pytest.mark.parametrize("name", [n for n in NOTEBOOKS if n != "00_start_here.ipynb"])
def test_every_section_says_why_and_what_to_try(name):
    """Each numbered section has the lesson's shape: why it matters, then something the learner does."""
    found = sections(name)
    lacking = [f"{n}: no {part}" for n, text in found.items()
               for part in ("**Why.**", "**Try it.**") if part not in text]
    assert found and not lacking, f"{name}: {len(found)} numbered sections; " + "; ".join(lacking)


def test_a_section_without_a_try_it_is_found(monkeypatch):
    """The shape test can fail: a notebook whose section lacks its try-it is named."""
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("## 1. A\n\n**Why.** x\n\n**Try it.** y"),
                                         nbformat.v4.new_markdown_cell("## 2. B\n\n**Why.** z")])
    monkeypatch.setitem(globals(), "notebook", lambda name: nb)
    with pytest.raises(AssertionError, match="2: no \\*\\*Try it"):
        test_every_section_says_why_and_what_to_try("x.ipynb")


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_no_notebook_cell_checks_a_figures_layout(name):
    found = [f"cell {i}: {m.group()}" for i, c in enumerate(notebook(name).cells) if c.cell_type == "code"
             for m in [LAYOUT.search(c.source)] if m]
    assert not found, f"{name}: layout checks belong in tests/test_plots.py: {found}"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_every_visible_code_cell_is_short(name):
    long = [f"cell {i} ({first_line(c)[:50]!r}): {len(c.source.splitlines())} lines"
            for i, c in enumerate(notebook(name).cells)
            if c.cell_type == "code" and visible(c) and len(c.source.splitlines()) > MAX_CELL_LINES]
    assert not long, f"{name}: visible code cells over {MAX_CELL_LINES} lines:\n" + "\n".join(long)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_a_notebook_is_read_in_one_sitting(name):
    words = sum(len(c.source.split()) for c in notebook(name).cells if c.cell_type == "markdown")
    assert words <= MAX_WORDS, f"{name}: {words} words of markdown (at most {MAX_WORDS})"


@pytest.mark.parametrize("name", [n for n in NOTEBOOKS if n != UNDER_THE_HOOD])
def test_only_the_notebook_under_the_hood_speaks_of_the_engineering(name):
    found = sorted({m.group() for c in notebook(name).cells for m in ENGINEERING.finditer(c.source)})
    assert not found, f"{name} says {found}: that belongs in {UNDER_THE_HOOD}"


def test_05_and_12_link_the_notebook_under_the_hood():
    for name in ("05_forward.ipynb", "12_where_next.ipynb"):
        text = " ".join(c.source for c in notebook(name).cells if c.cell_type == "markdown")
        assert f"]({UNDER_THE_HOOD})" in text, name


# ------------------------------------------------------------------ 00's walkthrough, against the folder


def walkthrough() -> list[tuple]:
    """00_start_here's WALKTHROUGH: (notebook, chapter section, what you will see, pitfalls explained)."""
    import ast

    for cell in notebook("00_start_here.ipynb").cells:
        for node in ast.parse(python_of(cell)).body if cell.cell_type == "code" else []:
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "WALKTHROUGH":
                return eval(compile(ast.Expression(node.value), "00_start_here", "eval"), {})
    raise AssertionError("00_start_here has no WALKTHROUGH")


def test_00s_walkthrough_lists_every_notebook_in_the_folder():
    listed = [name for name, *_ in walkthrough()]
    on_disk = [n.removesuffix(".ipynb") for n in NOTEBOOKS if n != "00_start_here.ipynb"]
    assert listed == on_disk, f"00 lists {listed}, the folder holds {on_disk}"


def test_each_notebook_names_the_pitfalls_00_says_it_explains():
    """Outside the pitfall lab (which lists its 22 from tl_lab's registry), a notebook names each pitfall
    00's table gives it, and every one of the 22 is explained where its section is taught."""
    rows = walkthrough()
    for name, _, _, pitfalls in rows:
        if name == "10_pitfalls":
            continue
        text = " ".join(c.source for c in notebook(f"{name}.ipynb").cells)
        named = set(re.findall(r"\bs(?:0[1-9]|1[0-9]|2[0-2])\b", text))
        assert set(pitfalls) <= named, f"{name} does not name {sorted(set(pitfalls) - named)}"
    assert {p for name, *_, ps in rows if name != "10_pitfalls" for p in ps} == {f"s{i:02d}" for i in range(1, 23)}


def test_00s_walkthrough_names_the_pitfalls_each_notebook_has_a_section_on():
    """Was: 03 showed '-' while it has a section on s08. Every pitfall a notebook's headings or its
    "pitfall sNN" lines name is in its row."""
    for name, _, _, pitfalls in walkthrough():
        if name == "10_pitfalls":
            continue
        text = " ".join(c.source for c in notebook(f"{name}.ipynb").cells if c.cell_type == "markdown")
        named = set(re.findall(r"\bpitfalls? \**(s(?:0[1-9]|1[0-9]|2[0-2]))\b", text))
        assert named <= set(pitfalls), f"{name} teaches {sorted(named - set(pitfalls))}, 00 does not list it"


# ------------------------------------------------------------------ two orders a learner took (issue 59)


def cell_index(nb, starts: str) -> int:
    """The index of the first code cell of `nb` whose source contains `starts`."""
    return next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and starts in c.source)


def test_01_runs_section_2_and_3_again_after_the_engine_is_loaded_again():
    """Was: re-running the engine's load cell, then section 2's cells, failed on `cached_blocks` (the new
    engine's pool had no cached prefix) until Restart & Run All."""
    from nbclient.exceptions import CellExecutionError

    need("nbformat")
    need("nbclient")
    with NotebookKernel("01_why_now.ipynb") as k:
        k.run_all()
        nb = k.nb
        load = cell_index(nb, "engine = Engine.load(")
        after = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and i > load]
        for index in [load, *after]:
            try:
                k.run_again(index)
            except CellExecutionError as exc:
                pytest.fail(f"cell {index} ({first_line(nb.cells[index])[:60]!r}) after the load cell again: {error_line(exc)}")


def test_07_reset_cell_runs_again_after_another_prompt_was_typed():
    """Was: typing another prompt into the model playground, then re-running the cell that presses
    `reset`, failed on "The capital of" (the cell took the typed prompt)."""
    from nbclient.exceptions import CellExecutionError

    need("nbformat")
    need("nbclient")
    with NotebookKernel("07_sampler.ipynb") as k:
        k.run_all()
        k.helper('mp.prompt.value = "Name three rivers in Europe."')
        index = cell_index(k.nb, "mp.reset_button.click()")
        try:
            k.run_again(index)
        except CellExecutionError as exc:
            pytest.fail(f"the reset cell after another prompt: {error_line(exc)}")


# ------------------------------------------------------------------ the learner writes each piece beside its lesson

SECTION_NOTEBOOKS = {"02_model_directory.ipynb": "model", "03_numbers.ipynb": "quant", "04_kv_pool.ipynb": "kv",
                     "05_forward.ipynb": "forward", "06_int4.ipynb": "quant", "07_sampler.ipynb": "sample"}


@pytest.mark.parametrize("name", SECTION_NOTEBOOKS)
def test_each_section_notebook_checks_the_learners_pieces_inline(name):
    """A section ends with the pieces of the learner's module it covers and a cell that tries each
    (exercise.try_piece); every piece named is one of the registry's."""
    from tl_lab.lab.exercise.registry import PIECES

    known = {f"{m}.{p.qualname}" for m, ps in PIECES.items() for p in ps}
    cells = [c.source for c in notebook(name).cells if c.cell_type == "code" and "exercise.try_piece(" in c.source]
    named = [p for src in cells for p in re.findall(r'"((?:kv|quant|model|forward|runner|sample)\.[\w.]+)"', src)]
    assert len(cells) >= 3 and named, f"{name}: {len(cells)} cells try the learner's pieces"
    assert set(named) <= known, f"{name} tries pieces the registry does not have: {sorted(set(named) - known)}"
    assert any(p.startswith(SECTION_NOTEBOOKS[name] + ".") for p in named), name
