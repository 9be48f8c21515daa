"""The clone's root conftest: pytest loads it for every run inside the clone, whatever the run collects
(tests/ alone, `pytest --nbval-lax notebooks/04_kv_pool.ipynb` alone, or both), before anything is
collected. tests/conftest.py holds the tests' helpers; a notebook-only run never loads it."""

import os

import pytest

# The project's own tests, and the notebooks nbval runs (their kernels inherit this), grade the reference:
# a learner's work/L10.1 in the clone is used only when TL_LAB_WORKSPACE asks for it (tl_lab.lab.exercise).
os.environ.setdefault("TL_LAB_WORKSPACE", "off")


def pytest_configure(config):
    """Give the run's child processes a temporary folder of their own, removed when the run ends.

    nbval stops a notebook's kernel by killing it, so a notebook's own clean-up (atexit) never runs
    there, and each run of 02 and 13 left a folder in /tmp. This process keeps the system's folder
    (pytest's tmp_path stays where it was): only the processes it starts inherit TMPDIR."""
    import tempfile

    tempfile.gettempdir()  # fixed for this process before TMPDIR changes
    config._tl_lab_tmp = (tempfile.mkdtemp(prefix="tl_lab-run-"), os.environ.get("TMPDIR"))
    os.environ["TMPDIR"] = config._tl_lab_tmp[0]


def pytest_unconfigure(config):
    import shutil

    tmp, before = getattr(config, "_tl_lab_tmp", (None, None))
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
        if before is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = before


WORKER_BYTES = 4 << 30
"""Memory a worker of the test command may need: its largest process held 3.8 GB (processor E)."""
MOST_WORKERS = 4
"""The test command runs each file on one worker (`--dist loadfile`, so a file's module fixtures and a
notebook's cells stay together). Its longest file, test_exercises.py, takes about a third of the tests'
time alone (5.4 of 18 minutes on one worker, processor E), so workers past three or four would wait on it."""


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """How many workers `pytest -n auto` starts (tools/quickstart.sh test): one per core this process may
    use, as many as the machine's memory holds at WORKER_BYTES each, at most MOST_WORKERS. On processor E
    (2 cores, 24 GB) two workers run the test command in 14 minutes instead of 18: one worker kept 1.25
    of the 2 cores busy on average (its subprocesses, the browser and the notebooks' kernels wait on
    one another)."""
    from tl_lab.ops.machine import cores

    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return max(1, min(cores(), memory // WORKER_BYTES, MOST_WORKERS))


# The files that take longest (tests/test_exercises*.py run the learner's code through real checks, notebooks
# and kernels compile or run whole notebooks), first: `--dist loadfile` hands whole files to the workers in
# collection order, and a long file handed out last runs alone at the end while the other worker idles
# (test_exercises.py was 1,182 s of a 1,647 s run). Within a file the order stays the file's own.
SLOW_FIRST = ("tests/test_exercises.py", "tests/test_notebooks.py", "tests/test_exercise_graded_runs.py",
              "tests/test_exercise_notebooks.py", "tests/test_kernels.py", "tests/test_browser.py",
              "tests/test_exercise_try.py", "tests/test_exercise_diagnose.py", "tests/test_pitfalls.py")


def pytest_collection_modifyitems(session, config, items):
    rank = {f: i for i, f in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))  # stable: the rest as collected
