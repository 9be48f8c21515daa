"""Switching a tl_lab module's source at import time: one mechanism for the pitfalls and the exercise.

An import hook (`SourceFinder`, first on sys.meta_path) serves chosen `tl_lab.*` modules from a
source text of its choosing, compiled under a filename of its choosing: a pitfall's edited
reference under the reference's path (`tl_lab.lab.pitfalls`), a learner's file under the learner's
own path (`tl_lab.lab.exercise`). Tracebacks then show the line that ran, from the text that ran.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import linecache
from collections.abc import Callable

__all__ = ["SourceLoader", "SourceFinder", "RefusingFinder"]


class SourceLoader(importlib.machinery.SourceFileLoader):
    """Loads a module from `source`, compiled under `path`; no .pyc is written (a broken module must
    never be cached as the module)."""

    def __init__(self, fullname: str, path: str, source: str):
        super().__init__(fullname, path)
        self.patched = source

    def get_source(self, fullname: str) -> str:
        return self.patched

    def get_code(self, fullname: str):
        # tracebacks read lines through linecache: give it the text that ran, not whatever is on disk
        linecache.cache[self.path] = (len(self.patched), None, self.patched.splitlines(True), self.path)
        return compile(self.patched, self.path, "exec", dont_inherit=True)


class SourceFinder(importlib.abc.MetaPathFinder):
    """Serves each module of `sources` ({fullname: (path, source)}) from its text; others pass by."""

    def __init__(self, sources: dict[str, tuple[str, str]]):
        self.served = sources

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.served:
            return None
        origin, source = self.served[fullname]
        return importlib.util.spec_from_file_location(fullname, origin, loader=SourceLoader(fullname, origin, source))


class RefusingFinder(importlib.abc.MetaPathFinder):
    """After an environment setting that cannot be honoured (a bad TL_LAB_PITFALL or TL_LAB_WORKSPACE,
    kept by `import tl_lab`): importing a module `refused` names raises `error` again, so a program
    meets it where it imports the wrong code, while the command line (tl_lab.__main__, which finds
    the finder) reports it as one line and exit code 2 instead of an import-time traceback."""

    def __init__(self, error: Exception, refused: Callable[[str], bool]):
        self.error = error
        self.refused = refused

    def find_spec(self, fullname, path=None, target=None):
        if self.refused(fullname):
            error = type(self.error)(str(self.error))
            # IPython shows an exception through its _render_traceback_ when it has one: the setting is at
            # fault, not a line of code, so a notebook's cell shows one line, as the command line does
            error._render_traceback_ = lambda: [f"{type(error).__name__}: {error}"]
            raise error
        return None


def refusal(kind: type) -> RefusingFinder | None:
    """The RefusingFinder of this process whose error is a `kind`, or None."""
    import sys

    return next((f for f in sys.meta_path if isinstance(f, RefusingFinder) and isinstance(f.error, kind)), None)
