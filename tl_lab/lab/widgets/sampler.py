"""The sampler playgrounds (chapter L10.1, sections 2.6 and 3), one import for the notebooks.

Each widget has its own module: `sampler_playground` (logits in, every stage drawn, one token out),
`model_playground` (the same on a model's next-token row), `sampler_charts` (what each stage shows).
"""

from tl_lab.lab.widgets.model_playground import ModelPlayground, loaded_model, playground_model_dir, show_model
from tl_lab.lab.widgets.sampler_charts import STAGES, stage_data
from tl_lab.lab.widgets.sampler_playground import GIVEN, MAX_DRAWS, PRESETS, SLIDERS, SamplerPlayground, show

__all__ = ["SamplerPlayground", "ModelPlayground", "playground_model_dir", "loaded_model", "PRESETS", "GIVEN",
           "MAX_DRAWS", "SLIDERS", "STAGES", "stage_data", "show", "show_model"]
