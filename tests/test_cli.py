"""python -m tl_lab generate / chat, run in subprocesses on the bundled models and on SmolLM2."""

import re
import subprocess
import sys

import pytest

from tl_lab.ops.paths import DATA_DIR, REPO_ROOT

STATS = re.compile(r"\[(\d+) tokens, finish=(\w+); prompt (\d+) tokens, (\d+) from the prefix cache")


def tl_lab(*args, stdin=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "tl_lab", *args], input=stdin, capture_output=True,
                          text=True, timeout=timeout, cwd=REPO_ROOT)


def stats(stderr: str):
    return [tuple(int(g) if g.isdigit() else g for g in m) for m in STATS.findall(stderr)]


# ------------------------------------------------------------------ generate


def test_generate_bigram_continues_bcd():
    p = tl_lab("generate", "--model", "bigram", "--prompt", "a", "--temperature", "0", "--max-tokens", "8", "--stats")
    assert p.returncode == 0, p.stderr
    assert p.stdout == "bcd abcd\n"
    assert stats(p.stderr) == [(8, "length", 1, 0)]


def test_generate_tiny_llama_by_path_is_seeded():
    args = ["generate", "--model", str(DATA_DIR / "tiny-llama"), "--prompt", "Hello", "--max-tokens", "20",
            "--temperature", "0.8", "--top-k", "40", "--top-p", "0.9", "--min-p", "0.01",
            "--repetition-penalty", "1.1", "--presence-penalty", "0.2", "--frequency-penalty", "0.1"]
    a, b, c = tl_lab(*args, "--seed", "7"), tl_lab(*args, "--seed", "7"), tl_lab(*args, "--seed", "8")
    assert a.returncode == b.returncode == c.returncode == 0, a.stderr
    assert a.stdout == b.stdout != c.stdout
    assert a.stderr == ""  # no --stats: nothing but the text


@pytest.mark.parametrize("model, extra", [("tiny-llama", ["--int4", "32"]), ("tiny-llama-int4", [])])
def test_generate_int4(model, extra):
    p = tl_lab("generate", "--model", model, "--prompt", "Hi", "--temperature", "0", "--max-tokens", "5", "--stats",
               *extra)
    assert p.returncode == 0, p.stderr
    assert stats(p.stderr)[0][:2] == (5, "length")


@pytest.mark.parametrize("bad, message", [
    (["--top-p", "1.5"], "error: top_p must be in (0, 1]"),
    (["--top-p", "0"], "error: top_p"),
    (["--temperature", "-1"], "error: temperature must be >= 0"),
    (["--top-k", "-3"], "error: top_k"),
    (["--min-p", "2"], "error: min_p"),
    (["--repetition-penalty", "0"], "error: repetition_penalty must be > 0"),
    (["--temperature", "nan"], "error: temperature must be finite"),
    (["--max-tokens", "0"], "error: --max-tokens must be at least 1"),
    (["--seed", "-1"], "error: --seed"),
    (["--int4", "3"], "error: Int4.group must be a positive even integer"),
    (["--kv-blocks", "0"], "error: --kv-blocks"),
    (["--prompt", ""], "error: the prompt is empty"),
    (["--prompt", "y" * 600], "error: --prompt: a prompt of 600 bytes is at least 600 tokens, longer than the context "
                              "(max_position_embeddings 512)"),
])
def test_bad_parameters_exit_2_with_one_line(bad, message):
    p = tl_lab("generate", "--model", "tiny-llama", "--prompt", "x", *bad)
    assert p.returncode == 2
    assert p.stderr.startswith(message) and p.stderr.count("\n") == 1, p.stderr
    assert "Traceback" not in p.stderr and p.stdout == ""


def test_argparse_errors_exit_2():
    p = tl_lab("generate", "--model", "tiny-llama", "--prompt", "x", "--top-k", "many")
    assert p.returncode == 2 and "invalid int value" in p.stderr and "Traceback" not in p.stderr
    p = tl_lab("generate", "--model", "tiny-llama")
    assert p.returncode == 2 and "--prompt" in p.stderr


def test_missing_model_and_exhausted_pool_exit_1():
    p = tl_lab("generate", "--model", "no/such/dir", "--prompt", "x")
    assert p.returncode == 1 and p.stderr.startswith("error: --model no/such/dir: not a model directory")
    p = tl_lab("generate", "--model", "tiny-llama", "--prompt", "x" * 40, "--kv-blocks", "2")
    assert p.returncode == 1 and "KV blocks" in p.stderr and "Traceback" not in p.stderr
    assert "raise --kv-blocks or lower --max-tokens" in p.stderr and "KvConfig" not in p.stderr  # the options


# ------------------------------------------------------------------ chat


def test_chat_on_a_byte_model_falls_back_to_plain_text():
    p = tl_lab("chat", "--model", "bigram", "--temperature", "0", "--max-tokens", "12", "--stats",
               stdin="hello\n\nhow are you\n/reset\nagain\n/quit\nnever read\n")
    assert p.returncode == 0, p.stderr
    assert "has no chat template" in p.stderr and "(conversation cleared)" in p.stderr
    replies = p.stdout.split("\n")
    assert len(replies) == 4 and replies[-1] == ""  # three turns (the empty line is skipped), then /quit
    turns = stats(p.stderr)
    assert len(turns) == 3
    assert turns[1][2] > turns[0][2] > 0  # the second prompt holds the whole first exchange
    assert turns[2][2] == turns[0][2] - len("hello") + len("again")  # /reset started over


def test_chat_ends_at_end_of_input():
    p = tl_lab("chat", "--model", "tiny-llama", "--max-tokens", "4", stdin="one line")
    assert p.returncode == 0 and p.stdout.count("\n") == 1


# ------------------------------------------------------------------ SmolLM2

# --threads 1: on two shared cores, OpenBLAS's two threads wait on each other when the machine is busy
# and a short run gets several times slower; one thread keeps these tests quick and steady.


@pytest.mark.smollm2
def test_smollm2_generate_with_the_chat_template():
    p = tl_lab("generate", "--model", "smollm2", "--template", "--prompt", "What is the capital of France?",
               "--temperature", "0", "--max-tokens", "12", "--threads", "1", "--stats")
    assert p.returncode == 0, p.stderr
    assert "Paris" in p.stdout
    ((n, finish, prompt, cached),) = stats(p.stderr)
    assert finish == "stop" and n < 12 and cached == 0


@pytest.mark.smollm2
def test_smollm2_chat_keeps_the_conversation_and_reuses_its_blocks():
    p = tl_lab("chat", "--model", "smollm2", "--temperature", "0", "--max-tokens", "16", "--threads", "1", "--stats",
               stdin="What is the capital of France?\nAnd of Italy?\n")
    assert p.returncode == 0, p.stderr
    first, second, end = p.stdout.split("\n")
    assert "Paris" in first and "Rome" in second and end == ""
    (t1, t2) = stats(p.stderr)
    assert t2[2] > t1[2] + t1[0]  # the second prompt holds the first question and answer
    assert t2[3] >= 32  # and finds their full blocks in the prefix cache


# ------------------------------------------------------------------ refusals come before the compiler


@pytest.mark.parametrize("argv, code", [
    (["generate", "--model", "bigram", "--prompt", "x", "--temperature", "-1"], 2),
    (["generate", "--model", "/nonexistent", "--prompt", "x"], 1),
    (["generate", "--model", "@bad-config", "--prompt", "x"], 1),
    (["generate", "--model", "@bad-header", "--prompt", "x"], 1),
    (["generate", "--model", "@bad-template", "--prompt", "x", "--template"], 1),
    (["generate", "--model", "tiny-llama", "--prompt", "x" * 513], 2),  # longer than the context (512)
    (["generate", "--model", "@long-template", "--prompt", "x", "--template"], 2),  # made so by the template
    (["chat", "--model", "@bad-template"], 1),
    (["generate", "--model", "tiny-llama", "--prompt", "x", "--max-tokens", "1"], 0),  # accepted: the engine runs
])
def test_a_refusal_is_said_before_the_compiler_is_imported(tmp_path, argv, code):
    """Issue 20: every command used to import the engine, and with it numba and llvmlite (0.4 s and
    75 MB here, 2 to 4 s on a busy host), before its input was checked. The arguments, the model's
    files and the prompt are now checked first (`_open_model`); only an accepted run imports it (`_engine`)."""
    import json
    import shutil

    bad = {"bad-config": {"hidden_size": 64.0}, "bad-template": {"tl_chat_template": "{{ raise_exception('no') }}"},
           "bad-header": {}, "long-template": {"tl_chat_template": "{{ 'x' * 600 }}"}}
    for name, config in bad.items():
        d = tmp_path / name
        shutil.copytree(DATA_DIR / "tiny-llama", d)
        c = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps({**c, **config}))
    (tmp_path / "bad-header" / "model.safetensors").write_bytes(b"\x08" + b"\0" * 7 + b"not json")
    argv = [str(tmp_path / a[1:]) if a.startswith("@") else a for a in argv]
    script = ("import sys\nfrom tl_lab.__main__ import main\ncode = main(sys.argv[1:])\n"
              "print(code, 'numba' in sys.modules, 'llvmlite' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", script, *argv], input="hi\n", capture_output=True, text=True,
                       timeout=300, cwd=REPO_ROOT)
    compiled = "True" if code == 0 else "False"
    assert p.stdout.splitlines()[-1] == f"{code} {compiled} {compiled}", (p.stdout, p.stderr)
    assert code == 0 or p.stderr.count("\n") == 1 and p.stderr.startswith("error: "), p.stderr
