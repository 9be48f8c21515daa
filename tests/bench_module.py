"""A benchmark script of benchmarks/ imported as a module by its tests (the folder is no package)."""

import importlib.util
import sys
from types import ModuleType

from tl_lab.paths import REPO_ROOT


def load(name: str) -> ModuleType:
    """benchmarks/<name>.py as the module `name` (registered, so its own imports of it resolve)."""
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
