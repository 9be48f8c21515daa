"""tl_lab: the model runner of chapter L10.1, in Python with numpy in Candle's role.

Modules follow the chapter's layers: quant (numbers), model (checkpoints), forward (the graph),
kv (the paged f16 cache), runner (ModelRunner), sample (PCG32 and the sampler).

TL_LAB_PITFALL=s13 (comma-separated ids allowed) switches the chapter's pitfalls on for this process
before any module they edit is imported (tl_lab.pitfalls, section 5). TL_LAB_WORKSPACE=DIR makes the
learner's files in DIR those modules (tl_lab.exercise). The two do not combine (a pitfall edits the
reference): with both set, every further tl_lab import raises, and the command line exits 2.
"""

import os as _os

__version__ = "0.1.0"

_WORKSPACE = _os.environ.get("TL_LAB_WORKSPACE", "")
_NAMED = _WORKSPACE.strip().lower() not in ("", "off", "0", "none")
_PITFALL = _os.environ.get("TL_LAB_PITFALL", "").strip()

if _PITFALL and _NAMED:
    from tl_lab import pitfalls as _pitfalls

    # both honoured, the first hook on sys.meta_path wins module by module: some of the learner's files run,
    # the pitfall's edited reference in place of others, and which is which depends on the import order
    _pitfalls.refuse_imports(_pitfalls.with_workspace(_PITFALL, _WORKSPACE))
elif _NAMED:
    from tl_lab.exercise import workspace as _workspace

    try:
        _workspace.install_from_env()
    except _workspace.ExerciseError as _exc:  # raised again by an import of the six; the CLI's one line
        _workspace.refuse_from_env(_exc)
elif _PITFALL:
    from tl_lab import pitfalls as _pitfalls

    try:
        _pitfalls.install_from_env()
    except _pitfalls.PitfallError as _exc:  # raised again by the next tl_lab import; the CLI's one line
        _pitfalls.refuse_imports(_exc)
