"""llama.cpp's speed on a GGUF, measured the way bench_smollm2.py measures tl_lab (run by it, in an
interpreter that has llama-cpp-python; needs nothing of tl_lab's).

    python benchmarks/_llamacpp.py MODEL.gguf THREADS PREFILL PROMPT STEPS ROUNDS

Prints one JSON line: prefill tokens/s of one PREFILL-token prompt, and decode tokens/s at batch 1
after a PROMPT-token prompt (greedy: each step's argmax fed back), the best of ROUNDS rounds of
STEPS steps, after one warm-up round; plus llama-cpp-python's version and its system info line.
"""

import json
import random
import sys
import time


def main(path: str, threads: int, prefill: int, prompt: int, steps: int, rounds: int) -> dict:
    import llama_cpp
    import numpy as np

    llm = llama_cpp.Llama(model_path=path, n_ctx=max(prefill, prompt + steps * (rounds + 1)) + 8, n_batch=prefill,
                          n_ubatch=prefill, n_threads=threads, n_threads_batch=threads, verbose=False)
    rng = random.Random(0)
    vocab = llm.n_vocab()
    toks = [rng.randrange(100, vocab) for _ in range(prefill)]

    def prefill_once() -> None:
        llm.reset()
        llm.eval(toks)

    best_prefill = min(_timed(prefill_once) for _ in range(rounds + 1))
    llm.reset()
    llm.eval(toks[:prompt])
    state = {"next": int(np.argmax(llm.scores[llm.n_tokens - 1]))}

    def decode() -> None:
        for _ in range(steps):
            llm.eval([state["next"]])
            state["next"] = int(np.argmax(llm.scores[llm.n_tokens - 1]))

    best_decode = min(_timed(decode) for _ in range(rounds + 1))
    return {"prefill_tok_s": prefill / best_prefill, "decode_b1_tok_s": steps / best_decode,
            "llama_cpp_python": llama_cpp.__version__,
            "system_info": llama_cpp.llama_print_system_info().decode().strip()}


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


if __name__ == "__main__":
    a = sys.argv[1:]
    print(json.dumps(main(a[0], *map(int, a[1:]))))
