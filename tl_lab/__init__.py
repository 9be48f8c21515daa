"""tl_lab: the model runner of chapter L10.1, in Python with numpy in Candle's role.

Modules follow the chapter's layers: quant (numbers), model (checkpoints), forward (the graph),
kv (the paged f16 cache), runner (ModelRunner), sample (PCG32 and the sampler).

TL_LAB_PITFALL=s13 (comma-separated ids allowed) switches the chapter's pitfalls on for this process
before any module they edit is imported (tl_lab.pitfalls, section 5). TL_LAB_WORKSPACE=DIR makes the
learner's files in DIR those modules (tl_lab.exercise); the two do not combine: a pitfall edits the reference.
"""

import os as _os

__version__ = "0.1.0"

if _os.environ.get("TL_LAB_WORKSPACE", "").strip().lower() not in ("", "off", "0", "none"):
    from tl_lab.exercise import workspace as _workspace

    try:
        _workspace.install_from_env()
    except _workspace.ExerciseError as _exc:  # raised again by an import of the six; the CLI's one line
        _workspace.refuse_from_env(_exc)

if _os.environ.get("TL_LAB_PITFALL", "").strip():
    from tl_lab import pitfalls as _pitfalls

    try:
        _pitfalls.install_from_env()
    except _pitfalls.PitfallError as _exc:  # raised again by the next tl_lab import; the CLI's one line
        _pitfalls.refuse_imports(_exc)
