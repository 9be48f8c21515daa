"""The clone's root conftest: pytest loads it for every run inside the clone, whatever the run collects
(tests/ alone, `pytest --nbval-lax notebooks/04_kv_pool.ipynb` alone, or both), before anything is
collected. tests/conftest.py holds the tests' helpers; a notebook-only run never loads it."""

import os

# The project's own tests, and the notebooks nbval runs (their kernels inherit this), grade the reference:
# a learner's work/L10.1 in the clone is used only when TL_LAB_WORKSPACE asks for it (tl_lab.exercise).
os.environ.setdefault("TL_LAB_WORKSPACE", "off")
