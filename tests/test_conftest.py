"""The test command's run-level hooks: the root conftest.py's worker count for `-n auto`, and tests/conftest.py's
summary at the run's end (the lines tests leave there, the hf tests left to the hf step), one worker or two."""

import subprocess
import sys
import textwrap
import types

import pytest

from conftest import module_from_file
from tl_lab.ops.paths import REPO_ROOT


def test_auto_workers_come_from_the_cores_and_the_memory(monkeypatch):
    root = module_from_file(REPO_ROOT / "conftest.py", "tl_lab_root_conftest")
    import tl_lab.ops.machine

    def machine(cores, gib):
        monkeypatch.setattr(tl_lab.ops.machine, "cores", lambda: cores)
        sizes = {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": gib * (1 << 30) // 4096}
        monkeypatch.setattr(root.os, "sysconf", sizes.__getitem__)
        return root.pytest_xdist_auto_num_workers(types.SimpleNamespace())

    assert root.WORKER_BYTES == 4 << 30 and root.MOST_WORKERS == 4
    assert machine(2, 24) == 2  # processor E
    assert machine(1, 24) == 1
    assert machine(16, 64) == 4  # past MOST_WORKERS the longest file is the wait
    assert machine(8, 8) == 2  # a laptop's memory holds two
    assert machine(8, 3) == 1  # never none


@pytest.mark.parametrize("workers", [[], ["-n", "2", "--dist", "loadfile"]], ids=["one process", "two workers"])
def test_the_run_ends_with_the_tests_summary_lines_and_the_hf_tests_left(tmp_path, workers):
    """A run of two files beside tests/conftest.py's hooks: the hf-marked test deselected is named at the end,
    once, and so is the line a test recorded (`record_property("summary", ...)`), with or without workers."""
    (tmp_path / "conftest.py").write_text(textwrap.dedent(f"""
        import importlib.util
        spec = importlib.util.spec_from_file_location("tl_lab_tests_conftest", {str(REPO_ROOT / "tests" / "conftest.py")!r})
        hooks = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(hooks)
        pytest_deselected, pytest_sessionfinish = hooks.pytest_deselected, hooks.pytest_sessionfinish
        pytest_testnodedown, pytest_terminal_summary = hooks.pytest_testnodedown, hooks.pytest_terminal_summary
        """))
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    hf: the hf step\n")
    (tmp_path / "test_a.py").write_text(textwrap.dedent("""
        import pytest

        def test_leaves_a_line(record_property):
            record_property("summary", "a line for the end: 3 of 3 caught")

        @pytest.mark.hf
        def test_needs_torch():
            pass
        """))
    (tmp_path / "test_b.py").write_text("def test_plain():\n    pass\n")
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-m", "not hf", *workers, str(tmp_path)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    assert out.count("a line for the end: 3 of 3 caught") == 1, out
    assert out.count("1 hf tests (in test_a.py) not run here: `bash tools/quickstart.sh hf` runs them") == 1, out
    assert ("2 workers" in out) == bool(workers), out
