"""A workspace started before the layout of section 2.1 (tl_lab/ops, engine, lab) still works.

`tests/data/workspace_before_layout.tar.gz` holds what `exercise start` wrote on 2026-12-07 before the
move (`stubs/`, untouched: they import `tl_lab.ops.checks`, `tl_lab.engine.blocks`, `tl_lab.ops.lazy_kernels` ...) and
the same six files completed (`done/`: the reference of that day, as a learner who finished would
have them). Made by `exercise start` at commit 97a5073, never edited since.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tl_lab.ops.paths import REPO_ROOT

ARCHIVE = Path(__file__).parent / "data" / "workspace_before_layout.tar.gz"


@pytest.fixture(scope="module")
def before(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("before")
    with tarfile.open(ARCHIVE) as tar:
        tar.extractall(root, filter="data")
    return root


def run(code_or_args, workspace: Path, timeout=600) -> subprocess.CompletedProcess:
    env = {**os.environ, "TL_LAB_WORKSPACE": str(workspace)}
    argv = [sys.executable, "-c", code_or_args] if isinstance(code_or_args, str) else [sys.executable, "-m", "tl_lab", *code_or_args]
    return subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_old_stubs_import_under_the_new_layout(before):
    done = run("import tl_lab.kv, tl_lab.quant, tl_lab.model, tl_lab.forward, tl_lab.runner, tl_lab.sample\n"
               "print(tl_lab.kv.__file__)", before / "stubs")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == str(before / "stubs" / "kv.py")


def test_an_old_finished_workspace_generates(before):
    """The learner's six old files run the engine: their imports of old names reach the moved modules,
    and the runner's old block manager and pipeline calls still work."""
    code = ("from tl_lab.engine.generate import Engine, Request\n"
            "from tl_lab.runner import ModelRunner, EngineConfig, KvConfig\n"
            "from tl_lab.ops.paths import DATA_DIR\n"
            "import tl_lab.runner, tl_lab.sample\n"
            "assert tl_lab.runner.__file__.endswith('done/runner.py') and tl_lab.sample.__file__.endswith('done/sample.py')\n"
            "r = ModelRunner.load(DATA_DIR / 'tiny-llama', EngineConfig(kv=KvConfig(n_blocks=32)))\n"
            "print([x.output_ids for x in Engine(r).generate([Request(prompt_ids=[1, 2, 3], max_tokens=5)])])\n")
    mine = run(code, before / "done")
    assert mine.returncode == 0, mine.stderr[-2000:]
    ref = run(code.replace("assert tl_lab", "# "), Path("off"))
    assert mine.stdout == ref.stdout  # the same tokens as the reference of today


def test_an_old_finished_workspace_passes_check(before):
    done = run(["exercise", "check", "kv", "sample", "--workspace", str(before / "done")], Path("off"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
