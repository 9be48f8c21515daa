"""tl_lab: the model runner of chapter L10.1, in Python with numpy in Candle's role.

Modules follow the chapter's layers: quant (numbers), model (checkpoints), forward (the graph),
kv (the paged f16 cache), runner (ModelRunner), sample (PCG32 and the sampler).

TL_LAB_PITFALL=s13 (comma-separated ids allowed) switches the chapter's pitfalls on for this process
before any module they edit is imported (tl_lab.pitfalls, section 5).
"""

import os as _os

__version__ = "0.1.0"

if _os.environ.get("TL_LAB_PITFALL", "").strip():
    from tl_lab.pitfalls import install_from_env as _install

    _install()
