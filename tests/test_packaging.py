"""The package's promises about itself: the two dependency lists agree, the commands exist."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _pyproject_requirements() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in ("dev", "hf"):
        reqs += project["optional-dependencies"][extra]
    return {r.replace(" ", "") for r in reqs}


def _environment_requirements() -> set[str]:
    text = (ROOT / "environment.yml").read_text()
    pip_block = text.split("- pip:", 1)[1]
    return {m.group(1).replace(" ", "") for m in re.finditer(r"^\s+- ([^#\s][^#\n]*?)\s*(?:#.*)?$", pip_block, re.M)}


def test_environment_yml_lists_the_same_set_as_pyproject():
    assert _environment_requirements() == _pyproject_requirements()


def test_torch_is_pinned_in_the_hf_extra_only():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "torch==2.13.0" in project["optional-dependencies"]["hf"]
    everything_else = project["dependencies"] + project["optional-dependencies"]["dev"]
    assert not [r for r in everything_else if r.startswith("torch")]


def test_ci_runs_exactly_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash tools/quickstart.sh test" in readme
    assert "bash tools/quickstart.sh lab" in readme
    assert re.search(r"^exec bash tools/quickstart.sh test$", ci, re.M)


def test_every_notebook_is_committed_without_outputs():
    import json

    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        dirty = [i for i, c in enumerate(cells) if c.get("outputs") or c.get("execution_count")]
        assert not dirty, f"{nb.name}: cells {dirty} carry outputs; clear them before committing"
