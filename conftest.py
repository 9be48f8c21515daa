"""The clone's root conftest: pytest loads it for every run inside the clone, whatever the run collects
(tests/ alone, `pytest --nbval-lax notebooks/04_kv_pool.ipynb` alone, or both), before anything is
collected. tests/conftest.py holds the tests' helpers; a notebook-only run never loads it."""

import os

# The project's own tests, and the notebooks nbval runs (their kernels inherit this), grade the reference:
# a learner's work/L10.1 in the clone is used only when TL_LAB_WORKSPACE asks for it (tl_lab.exercise).
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
