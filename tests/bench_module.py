"""A benchmark script of benchmarks/ imported as a module by its tests (the folder is no package)."""

from types import ModuleType

from conftest import module_from_file
from tl_lab.ops.paths import REPO_ROOT


def load(name: str) -> ModuleType:
    """benchmarks/<name>.py as the module `name` (registered, so its own imports of it resolve)."""
    return module_from_file(REPO_ROOT / "benchmarks" / f"{name}.py", name)
