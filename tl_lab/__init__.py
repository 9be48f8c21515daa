"""tl_lab: the model runner of chapter L10.1, in Python with numpy in Candle's role.

The layout is the chapter's section 2.1 diagram. On top, the six modules a learner writes: quant
(numbers), model (checkpoints), forward (the graph), kv (the paged f16 cache), runner (ModelRunner),
sample (PCG32 and the sampler). Under them, `tl_lab.ops`: what plays candle-core and candle-nn.
Above them, `tl_lab.engine`: what uses the runner (the block manager, the engine loop, the
tokenizer, fetch). Beside them, `tl_lab.lab`: pitfalls, exercise, widgets. Imports point one way
(tests/test_layers.py holds it).

TL_LAB_PITFALL=s13 (comma-separated ids allowed) switches the chapter's pitfalls on for this process
before any module they edit is imported (tl_lab.lab.pitfalls, section 5). TL_LAB_WORKSPACE=DIR makes the
learner's files in DIR those modules (tl_lab.lab.exercise). The two do not combine (a pitfall edits the
reference): with both set, every further tl_lab import raises, and the command line exits 2.
"""

import os as _os

__version__ = "0.1.0"

# Where the given modules lived before the layout of section 2.1 (2026-12-07). A workspace started
# earlier has stubs that say `from tl_lab.checks import ...`: each old name is the new module itself
# (one module object, so isinstance and module state agree), found last, after every real file.
_MOVED = {
    **{m: "ops" for m in ("kernels", "lanes", "widening", "products", "q8", "fp8", "machine", "tuning",
                          "lazy_kernels", "schema", "checks", "paths", "pipeline")},
    **{m: "engine" for m in ("blocks", "generate", "tokenizer", "fetch")},
    **{m: "lab" for m in ("pitfalls", "switch", "compare", "exercise", "widgets")},
}


class _MovedFinder:
    """`tl_lab.<old name>[.sub]` -> `tl_lab.<layer>.<old name>[.sub]`, the same module object."""

    @staticmethod
    def new_name(fullname: str) -> str | None:
        parts = fullname.split(".")
        if len(parts) < 2 or parts[0] != __name__ or parts[1] not in _MOVED:
            return None
        return ".".join([__name__, _MOVED[parts[1]], *parts[1:]])

    def find_spec(self, fullname, path=None, target=None):
        new = self.new_name(fullname)
        if new is None:
            return None
        import importlib.util

        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        import importlib

        return importlib.import_module(self.new_name(spec.name))

    def exec_module(self, module):
        pass  # already executed under its new name


if not any(type(f).__name__ == "_MovedFinder" for f in __import__("sys").meta_path):
    __import__("sys").meta_path.append(_MovedFinder())

_WORKSPACE = _os.environ.get("TL_LAB_WORKSPACE", "")
_NAMED = _WORKSPACE.strip().lower() not in ("", "off", "0", "none")
_PITFALL = _os.environ.get("TL_LAB_PITFALL", "").strip()

if _PITFALL and _NAMED:
    from tl_lab.lab import pitfalls as _pitfalls

    # both honoured, the first hook on sys.meta_path wins module by module: some of the learner's files run,
    # the pitfall's edited reference in place of others, and which is which depends on the import order
    _pitfalls.refuse_imports(_pitfalls.with_workspace(_PITFALL, _WORKSPACE))
elif _NAMED:
    from tl_lab.lab.exercise import workspace as _workspace

    try:
        _workspace.install_from_env()
    except _workspace.ExerciseError as _exc:  # raised again by an import of the six; the CLI's one line
        _workspace.refuse_from_env(_exc)
elif _PITFALL:
    from tl_lab.lab import pitfalls as _pitfalls

    try:
        _pitfalls.install_from_env()
    except _pitfalls.PitfallError as _exc:  # raised again by the next tl_lab import; the CLI's one line
        _pitfalls.refuse_imports(_exc)
