"""tools/screenshots.py: every picture names cells that exist, once each, in its notebook.

The browser suite writes one of the pictures (tests/test_browser.py); this checks all of them without
a browser, so a notebook edit that renames a widget's cell fails here, not only when someone next
runs the tool (the sampler's picture had pointed at a cell the learner-workflow change renamed).
"""

import pytest

from conftest import tool
from lab_harness import code_sources
from tl_lab.ops.paths import REPO_ROOT

SHOTS = tool("screenshots").SHOTS


@pytest.mark.parametrize("shot", SHOTS, ids=[s.png for s in SHOTS])
def test_each_picture_names_one_code_cell_of_its_notebook_for_itself_and_every_act(shot):
    code = code_sources(shot.notebook)
    for cell in (shot.cell, *(a.cell for a in shot.then)):
        found = sum(cell in src for src in code)
        assert found == 1, f"{shot.png}: {found} code cells of {shot.notebook} contain {cell!r}"


def test_the_pictures_are_distinct_files_the_readme_shows():
    names = [s.png for s in SHOTS]
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    assert len(set(names)) == len(names)
    for name in names:
        assert (REPO_ROOT / "docs" / "images" / name).is_file(), name
        assert f"docs/images/{name}" in readme, f"the README does not show {name}"
