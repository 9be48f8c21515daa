"""Make data/tiny-llama: a tiny random Llama built with Hugging Face transformers, saved as BF16.

    python tools/make_tiny_llama.py [--out DIR]                (needs the hf extra: torch, transformers)
    python tools/make_tiny_llama.py --untied [--out DIR]       data/tiny-llama-untied

The model (chapter L10.1, section 2.4's test model): byte vocabulary (256), hidden size 64,
2 layers, 4 query heads and 2 key/value heads (grouped-query attention, head_dim 16),
intermediate size 128, tied embeddings, RoPE theta 10000, 512 positions, RMSNorm eps 1e-5.
Token ids are bytes; bos_token_id 2 (ASCII STX) and eos_token_id 3 (ETX), as for the bigram.

Weights are random but not HF's default initialization, which is tuned for training, not for a
test: with std 0.02 every layer is a near-identity and the logits are tiny. Instead
* the embedding (which is also the LM head) has std EMBED_STD;
* the value, output and MLP linears have std GAIN / sqrt(fan_in), so attention and the MLP move
  the residual stream about as much as the embedding does (a bug in either shows in the logits);
  q_proj and k_proj use QK_GAIN, which keeps attention soft enough that rounding K and V to f16
  (the runner's cache) moves the logits by about 1e-2 at most, inside the chapter's 2e-2;
* the RMSNorm weights are 1 + 0.1 N(0, 1), so a skipped or misplaced norm shows, and the final
  norm is scaled by FINAL_NORM (trained Llamas also have final-norm weights well above 1): it sets
  the logit scale, about 20 at the last token, without changing what the layers compute.
The constants (and SEED) were picked by trying scales and seeds and keeping one whose greedy streams
vary (no token repeated forever) and whose top-two logits never come closer than 0.05 over
32 greedy steps of the PROMPTS, so greedy comparisons with f16 KV are not decided by near-ties.

The values come from numpy's PCG64 generator with a fixed seed, not from torch.randn: numpy's
normal sampler is the same C code on every CPU, while torch's vectorized CPU sampler may differ
in the last bits between CPU features, and this script must reproduce the committed file byte
for byte anywhere (tests/test_tools_checkpoints.py). torch.manual_seed is set as well, for
anything transformers might draw. The values are rounded to BF16, loaded into a
LlamaForCausalLM, checked (the saved directory loads back in transformers and gives the same
logits), and written with the safetensors library under Hugging Face's tensor names, without
lm_head.weight (tied).

`--untied` makes data/tiny-llama-untied, the same model with its own LM head: CONFIG with
tie_word_embeddings false (UNTIED_CONFIG) and an lm_head.weight tensor. The head is drawn last, after
every tensor of the tied model, from the same generator with the embedding's std, so every other tensor
is bit for bit the tied model's and the logits keep their scale; only the head differs. It pins the path
a tied model never takes (the runner's and the forward's tests, against its own golden file
data/golden/tiny_llama_untied_hf.json from tools/make_goldens.py).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from tl_lab.ops.paths import DATA_DIR

SEED = 37
EMBED_STD = 0.45
GAIN = 2.0
QK_GAIN = 1.0
NORM_JITTER = 0.1
FINAL_NORM = 1.8

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "tl_arch": "llama",
    "tl_tokenizer": "byte",
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "mlp_bias": False,
    "bos_token_id": 2,
    "eos_token_id": 3,
    "torch_dtype": "bfloat16",
}

# The same model with its own LM head (tools/make_tiny_llama.py --untied): tensor_shapes lists
# lm_head.weight last, so the other draws are the tied model's.
UNTIED_CONFIG = {**CONFIG, "tie_word_embeddings": False}

# Prompts whose last-token logits the script reports (and the tests check the scale on).
GREEDY_STEPS = 32
PROMPTS = [b"Hello, world", b"abcd", b"The tiny Llama", b"\x02", b"Once upon a time", b"x"]


def random_weights(config: dict) -> dict[str, np.ndarray]:
    """Hugging Face name -> float32 array, drawn in tl_lab's tensor order from one seeded generator."""
    from tl_lab.model import ModelConfig, tensor_shapes

    rng = np.random.default_rng(SEED)
    out = {}
    for name, shape in tensor_shapes(ModelConfig.from_json(json.dumps(config))).items():
        z = rng.standard_normal(shape)
        if name in ("model.embed_tokens.weight", "lm_head.weight"):  # an untied head: the embedding's scale
            w = EMBED_STD * z
        elif name.endswith("norm.weight"):
            w = (FINAL_NORM if name == "model.norm.weight" else 1.0) * (1.0 + NORM_JITTER * z)
        else:  # a linear, (out, in)
            gain = QK_GAIN if name.endswith(("q_proj.weight", "k_proj.weight")) else GAIN
            w = gain / np.sqrt(shape[1]) * z
        out[name] = w.astype(np.float32)
    return out


def build(out: Path, config: dict = CONFIG) -> dict:
    """Write out/config.json and out/model.safetensors for `config` (CONFIG or UNTIED_CONFIG); return
    `check`'s report."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    weights = random_weights(config)
    bf16 = {k: torch.from_numpy(v).to(torch.bfloat16).contiguous() for k, v in weights.items()}

    hf_config = LlamaConfig(**{k: v for k, v in config.items() if not k.startswith("tl_")})
    model = LlamaForCausalLM(hf_config).to(torch.float32).eval()
    state = {k: v.to(torch.float32) for k, v in bf16.items()}
    if config["tie_word_embeddings"]:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True)  # every name and shape must fit HF's model
    if not config["tie_word_embeddings"] and model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr():
        raise RuntimeError("transformers tied the LM head to the embedding of an untied config")

    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(bf16, str(out / "model.safetensors"), metadata={"format": "pt"})

    # Loaded in its stored dtype, then widened: bf16 -> f32 is exact, and no dtype keyword
    # differs between transformers 4.x and 5.x.
    reloaded = LlamaForCausalLM.from_pretrained(out).to(torch.float32).eval()
    return check(model, reloaded)


def check(model, reloaded) -> dict:
    """The built model against its reload, and its shape: max |logit| and greedy top-two gaps.

    Returns {"max_logit": {prompt: max |last-token logit|}, "min_gap": the smallest top-1 minus
    top-2 logit over 32 greedy steps of every prompt}.
    """
    import torch

    report = {"max_logit": {}, "min_gap": float("inf")}
    with torch.no_grad():
        for p in PROMPTS:
            ids = torch.tensor([list(p)])
            a, b = model(ids).logits[0, -1], reloaded(ids).logits[0, -1]
            if not torch.equal(a, b):
                raise RuntimeError(f"the saved directory does not load back as built (prompt {p!r})")
            report["max_logit"][p] = float(a.abs().max())
            for _ in range(GREEDY_STEPS):
                top2 = torch.topk(model(ids).logits[0, -1], 2)
                report["min_gap"] = min(report["min_gap"], float(top2.values[0] - top2.values[1]))
                ids = torch.cat([ids, top2.indices[:1].view(1, 1)], dim=1)
    return report


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--untied", action="store_true", help="the model with its own LM head (data/tiny-llama-untied)")
    ap.add_argument("--out", type=Path, default=None, help="default data/tiny-llama (data/tiny-llama-untied with --untied)")
    args = ap.parse_args(argv)
    args.out = args.out or DATA_DIR / ("tiny-llama-untied" if args.untied else "tiny-llama")
    report = build(args.out, UNTIED_CONFIG if args.untied else CONFIG)
    print(f"wrote {args.out}/config.json and {args.out}/model.safetensors")
    for p, m in report["max_logit"].items():
        print(f"  max |logit| after {p!r}: {m:.2f}")
    print(f"  smallest top-1 minus top-2 logit over {GREEDY_STEPS} greedy steps: {report['min_gap']:.4f}")


if __name__ == "__main__":
    main()
