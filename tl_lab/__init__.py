"""tl_lab: the model runner of chapter L10.1, in Python with numpy in Candle's role.

Modules follow the chapter's layers: quant (numbers), model (checkpoints), forward (the graph),
kv (the paged f16 cache), runner (ModelRunner), sample (PCG32 and the sampler).

TL_LAB_PITFALL=s13 (comma-separated ids allowed) switches the chapter's pitfalls on for this process
before any module they edit is imported (tl_lab.pitfalls, section 5).
"""

import os as _os

__version__ = "0.1.0"

if _os.environ.get("TL_LAB_PITFALL", "").strip():
    from tl_lab import pitfalls as _pitfalls

    try:
        _pitfalls.install_from_env()
    except _pitfalls.PitfallError as _exc:  # raised again by the next tl_lab import; the CLI's one line
        _pitfalls.refuse_imports(_exc)
