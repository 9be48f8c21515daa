"""tl_lab/lab/switch.py: the import hook that serves a module from a text of its choosing, under a path of its
choosing (a pitfall's edited reference, a learner's file), and refuses imports after a bad setting."""

import importlib
import importlib.util
import inspect
import sys
import traceback

import pytest

from tl_lab.lab.switch import RefusingFinder, SourceFinder, refusal

SOURCE = '''def double(x: int) -> int:
    """Served, not read from disk."""
    return 2 * x


def broken():
    raise ValueError("from the served text")
'''


@pytest.fixture
def served(tmp_path):
    """A module `tl_lab_served_probe` served from SOURCE under a path whose file on disk says otherwise."""
    path = tmp_path / "served_probe.py"
    path.write_text("raise AssertionError('the file on disk was run')\n")
    finder = SourceFinder({"tl_lab_served_probe": (str(path), SOURCE)})
    sys.meta_path.insert(0, finder)
    try:
        yield importlib.import_module("tl_lab_served_probe"), path
    finally:
        sys.meta_path.remove(finder)
        sys.modules.pop("tl_lab_served_probe", None)


def test_a_served_module_runs_its_text_under_its_path_and_name(served):
    module, path = served
    assert module.double(21) == 42
    assert module.__file__ == str(path) and module.__spec__.origin == str(path)
    assert module.__name__ == module.__spec__.name == module.__spec__.loader.name == "tl_lab_served_probe"
    assert importlib.util.find_spec("json").origin.endswith("json/__init__.py")  # other modules pass by


def test_its_source_and_tracebacks_show_the_text_that_ran(served):
    module, path = served
    assert inspect.getsource(module.double) == SOURCE[: SOURCE.index("\n\n\n") + 1]
    with pytest.raises(ValueError) as e:
        module.broken()
    frame = traceback.extract_tb(e.value.__traceback__)[-1]
    assert frame.filename == str(path) and frame.line == 'raise ValueError("from the served text")'


def test_its_text_is_compiled_without_the_hooks_own_future_imports(served):
    """switch.py has `from __future__ import annotations`; the served text must not inherit it."""
    module, _ = served
    assert module.double.__annotations__ == {"x": int, "return": int}


def test_a_refusing_finder_raises_its_error_again_for_the_names_it_refuses():
    finder = RefusingFinder(LookupError("TL_LAB_WORKSPACE: no such folder"), lambda name: name.startswith("tl_lab_refused"))
    sys.meta_path.insert(0, finder)
    try:
        with pytest.raises(LookupError, match="^TL_LAB_WORKSPACE: no such folder$") as e:
            importlib.import_module("tl_lab_refused_probe")
        assert e.value is not finder.error  # a new error each time, with the same text
        # a notebook's cell (IPython) shows it as this one line, not the import machinery's traceback
        assert e.value._render_traceback_() == ["LookupError: TL_LAB_WORKSPACE: no such folder"]
        assert finder.find_spec("json") is None
        assert refusal(LookupError) is finder and refusal(KeyError) is None
    finally:
        sys.meta_path.remove(finder)
    assert refusal(LookupError) is None
