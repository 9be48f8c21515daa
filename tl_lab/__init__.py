"""tl_lab: the model runner of chapter L10.1, in Python with numpy in Candle's role.

Modules follow the chapter's layers: quant (numbers), model (checkpoints), forward (the graph),
kv (the paged f16 cache), runner (ModelRunner), sample (PCG32 and the sampler).
"""

__version__ = "0.1.0"
