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


def _environment_requirements() -> tuple[set[str], set[str]]:
    """(conda-forge specs, pip specs) of environment.yml, comments and python/pip themselves left out."""
    text = (ROOT / "environment.yml").read_text()
    conda_block, pip_block = text.split("dependencies:", 1)[1].split("- pip:", 1)
    spec = re.compile(r"^\s+- ([^#\s][^#\n]*?)\s*(?:#.*)?$", re.M)
    conda = {m.group(1).replace(" ", "") for m in spec.finditer(conda_block)} - {"pip"}
    conda = {c for c in conda if not c.startswith("python")}
    return conda, {m.group(1).replace(" ", "") for m in spec.finditer(pip_block)}


def test_environment_yml_lists_the_same_set_as_pyproject():
    conda, pip = _environment_requirements()
    assert conda | pip == _pyproject_requirements()
    assert not conda & pip


def test_environment_yml_takes_conda_forge_packages_and_pip_only_for_torch():
    conda, pip = _environment_requirements()
    assert pip == {"torch==2.13.0"}  # the one pinned release conda-forge does not build
    assert "conda-forge" in (ROOT / "environment.yml").read_text().split("channels:", 1)[1].split("dependencies:")[0]


def _lock() -> dict[str, str]:
    """requirements.lock as {name: version}."""
    text = (ROOT / "requirements.lock").read_text()
    return {m.group(1).lower(): m.group(2) for m in re.finditer(r"^([A-Za-z0-9_.-]+)==(\S+)", text, re.M)}


def test_the_lock_pins_every_requirement_within_its_floor_with_hashes():
    from packaging.requirements import Requirement

    lock = _lock()
    for line in _pyproject_requirements():
        req = Requirement(line)
        version = lock.get(req.name.lower().replace("_", "-"))
        assert version is not None, f"{req.name} is in pyproject.toml but not in requirements.lock: bash tools/lock.sh"
        assert req.specifier.contains(version, prereleases=True), (line, version)
    assert "numba" in lock and "llvmlite" in lock
    text = (ROOT / "requirements.lock").read_text()
    pinned = re.findall(r"^([A-Za-z0-9_.-]+)==\S+ \\\n((?:\s+--hash=sha256:[0-9a-f]{64}.*\n)+)", text, re.M)
    assert {name.lower() for name, _ in pinned} == set(lock), "every locked package carries its hashes"


def test_the_lock_takes_torch_cpu_and_no_cuda_packages():
    lock = _lock()
    assert lock["torch"].startswith("2.13.0")
    assert not [name for name in lock if name.startswith("nvidia-")]


def test_quickstart_installs_from_the_lock_and_lock_sh_regenerates_it():
    quickstart = (ROOT / "tools" / "quickstart.sh").read_text()
    assert re.search(r'^LOCK=requirements\.lock', quickstart, re.M)
    assert 'pip install -q -r "$LOCK"' in quickstart
    assert "--output-file requirements.lock" in (ROOT / "tools" / "lock.sh").read_text()
    assert "bash tools/lock.sh" in (ROOT / "README.md").read_text()


def test_torch_is_pinned_in_the_hf_extra_only():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "torch==2.13.0" in project["optional-dependencies"]["hf"]
    everything_else = project["dependencies"] + project["optional-dependencies"]["dev"]
    assert not [r for r in everything_else if r.startswith("torch")]


def test_the_wheel_carries_the_data_and_the_schema_and_builds_without_warnings(tmp_path):
    """A non-editable install has no repository: the bundled models, golden files and the config schema
    must be inside the wheel (tl_lab/_data, tl_lab/_formats; tl_lab.paths finds them there)."""
    import subprocess
    import sys
    import zipfile

    import shutil

    src = tmp_path / "src"  # a copy, so setuptools' build/ and egg-info never land in the checkout
    for part in ("pyproject.toml", "README.md", "tl_lab", "data", "docs/formats"):
        copy = shutil.copytree if (ROOT / part).is_dir() else shutil.copy
        (src / part).parent.mkdir(parents=True, exist_ok=True)
        copy(ROOT / part, src / part, **({"ignore": shutil.ignore_patterns("__pycache__")} if copy is shutil.copytree else {}))
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation",
                        "-w", str(tmp_path), str(src)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    noise = [l for l in (p.stdout + p.stderr).splitlines()
             if re.search(r"deprecat|warning", l, re.I) and "byte-compiling is disabled" not in l]
    assert not noise, noise
    (wheel,) = tmp_path.glob("tl_lab-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    data = {f"tl_lab/_data/{f.relative_to(ROOT / 'data')}" for f in (ROOT / "data").rglob("*") if f.is_file()}
    assert data and data <= names, sorted(data - names)
    assert "tl_lab/_formats/config.schema.json" in names


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
