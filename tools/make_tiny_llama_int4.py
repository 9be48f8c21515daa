"""Make data/tiny-llama-int4: the tiny Llama written as an int4 file by tl_lab's own quantizer.

    python tools/make_tiny_llama_int4.py [--src DIR] [--out DIR] [--group 32]

Chapter L10.1, section 2.5, and docs/formats/safetensors.md ("Int4 files"). Every layer linear
`<name>.weight` of the source becomes `<name>.qweight` (U8) and `<name>.scales` (F16 bits),
made by `tl_lab.quant.QLinear.quantize` in groups of `--group` columns, and the file's metadata
says `quant = "int4-g<group>-sym"`. Everything else (the embedding, the norms, an untied
lm_head) is written as F32, widened from the source exactly as `load_weights` widens it, so
`load_weights(out)` and `load_weights(src, quant=Int4(group))` hold the same arrays bit for bit
(tests/test_model.py checks that, and tests/test_tools_checkpoints.py that this script
reproduces the committed files). config.json is the source's plus `"tl_quant": "int4-g32-sym"`.

Needs only numpy and the safetensors library (numpy has no bfloat16, which is why the
non-quantized tensors are written as F32 rather than copied as BF16).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from tl_lab.model import Int4, ModelConfig, SafeTensors, file_quant, tensor_shapes
from tl_lab.ops.paths import DATA_DIR
from tl_lab.quant import QLinear


def quantized_tensors(src: Path, scheme: Int4) -> dict[str, np.ndarray]:
    """Name -> array of the int4 file: one source tensor read (and dropped) at a time."""
    config = ModelConfig.load(src)
    if config.arch != "llama":
        raise SystemExit(f"{src}: a {config.arch} checkpoint has no linear layers to quantize")
    tensors: dict[str, np.ndarray] = {}
    with SafeTensors.open(src / "model.safetensors") as st:
        if file_quant(st) is not None:
            raise SystemExit(f"{src}/model.safetensors is already {st.metadata['quant']}")
        for name, shape in tensor_shapes(config).items():
            w = st.f32(name, shape)
            if name.startswith("model.layers.") and name.endswith("_proj.weight"):
                q = QLinear.quantize(w, scheme.group)
                base = name[: -len(".weight")]
                tensors[f"{base}.qweight"] = q.qweight
                tensors[f"{base}.scales"] = q.scales.view(np.float16)  # written as F16, same bits
            else:
                tensors[name] = w
    return tensors


def build(out: Path, src: Path = DATA_DIR / "tiny-llama", group: int = 32) -> None:
    """Write out/config.json and out/model.safetensors (the int4 file)."""
    scheme = Int4(group)
    tensors = quantized_tensors(src, scheme)
    config = json.loads((src / "config.json").read_text())
    config["tl_quant"] = scheme.tag
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    # Only the one key: the library writes metadata in hash-map order, so a second key could
    # swap places between runs and the file would not be reproducible byte for byte.
    save_file(tensors, str(out / "model.safetensors"), metadata={"quant": scheme.tag})


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, default=DATA_DIR / "tiny-llama")
    ap.add_argument("--out", type=Path, default=DATA_DIR / "tiny-llama-int4")
    ap.add_argument("--group", type=int, default=32)
    args = ap.parse_args(argv)
    build(args.out, args.src, args.group)
    print(f"wrote {args.out}/config.json and {args.out}/model.safetensors ({Int4(args.group).tag})")


if __name__ == "__main__":
    main()
