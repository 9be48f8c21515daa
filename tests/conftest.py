"""Shared test helpers. A test that needs something missing fails and says what to install."""

import contextlib
import importlib
import os

import pytest

INSTALL_HINT = {
    "transformers": "the hf extra: pip install -e '.[hf]'  (transformers and torch==2.13.0)",
    "torch": "the hf extra: pip install -e '.[hf]'  (transformers and torch==2.13.0)",
    "playwright": "the dev extra: pip install -e '.[dev]'",
    "playwright.sync_api": "the dev extra: pip install -e '.[dev]'",
    "jupyterlab": "the dev extra: pip install -e '.[dev]'",
    "psutil": "the dev extra: pip install -e '.[dev]'  (psutil comes with jupyterlab's ipykernel)",
    "nbclient": "the dev extra: pip install -e '.[dev]'  (nbclient comes with nbval and jupyterlab)",
    "nbformat": "the dev extra: pip install -e '.[dev]'  (nbformat comes with nbval and jupyterlab)",
}


def need(module: str):
    """Import `module` or fail the test with the install command (never skip: a skip hides a gap)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        hint = INSTALL_HINT.get(module, f"pip install {module}")
        pytest.fail(f"this test needs `{module}` ({exc}); install {hint}", pytrace=False)


def tool(name: str):
    """Import tools/<name>.py as a module (tools/ is a folder of scripts, not a package)."""
    from tl_lab.ops.paths import REPO_ROOT

    return module_from_file(REPO_ROOT / "tools" / f"{name}.py", name)


def module_from_file(path, name: str):
    """Import the Python file `path` as the module `name`: a script of tools/ or benchmarks/, a conftest.py.

    Registered in sys.modules under that name so dataclasses and pickling inside it work."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def blas_threads_set(n: int):
    """OpenBLAS at n threads inside the block, then the previous count again.

    The SmolLM2 tests run with one: on two shared cores, OpenBLAS's two threads wait on each other
    whenever the machine is busy (a step several times slower)."""
    from tl_lab.ops.tuning import blas_threads, set_blas_threads

    before = blas_threads()
    set_blas_threads(n)
    try:
        yield
    finally:
        if before is not None:
            set_blas_threads(before)


@pytest.fixture
def one_blas_thread():
    """One BLAS thread for the test, then the previous count (`blas_threads_set`)."""
    with blas_threads_set(1):
        yield


@pytest.fixture
def restore_threads():
    """The kernels' thread count (numba's, this thread's) as it was before the test, after it."""
    import numba

    from tl_lab.ops.kernels import set_threads

    before = numba.get_num_threads()
    yield
    set_threads(before)


SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("Ġ", "Ġ"), ("l", "l"), ("he", "ll"), ("hell", "o")]


def write_bpe_tokenizer(path, alter=lambda tok: None, drop: str = "") -> int:
    """Write a byte-level BPE tokenizer.json (digits split, the three SPECIALS first, the MERGES last)
    to `path` -> its number of tokens. `drop`: bytes left out of the vocabulary (the library drops them
    from a text); alter(tok) changes the library's Tokenizer before it is saved."""
    from tokenizers import AddedToken
    from tokenizers import Tokenizer as HfTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    from tl_lab.engine.tokenizer import _bytes_to_unicode

    alphabet = [_bytes_to_unicode()[b] for b in range(256) if chr(b) not in drop]
    tokens = SPECIALS + alphabet + ["".join(m) for m in MERGES]
    tok = HfTokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=MERGES))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    alter(tok)  # after the specials: adding a token again replaces it
    tok.save(str(path))
    return len(tokens)


def write_sentencepiece_tokenizer(path, style: str, byte_fallback: bool = True, fuse_unk: bool = True,
                                  size: int | None = None) -> int:
    """A SentencePiece-style tokenizer.json at `path`: "▁" for a space, 256 byte-fallback tokens (or
    none), "<unk>" -> its number of tokens. style "llama2": the normalizer prepends "▁" and replaces " "
    (Llama 2, Mistral); "metaspace": a Metaspace pre-tokenizer does both (the newer files); "gemma":
    the normalizer only replaces. size: words "▁" + one character added until there are that many
    (for decoding: no merges make them)."""
    from tokenizers import AddedToken
    from tokenizers import Tokenizer as HfTokenizer
    from tokenizers import decoders, models, normalizers, pre_tokenizers

    merges = [("▁", "h"), ("e", "l"), ("el", "l"), ("▁h", "ell"), ("▁hell", "o"), ("▁", "▁"), ("▁▁", "▁▁"),
              ("▁▁▁▁", "▁▁▁▁")]
    fallback = [f"<0x{b:02X}>" for b in range(256)] if byte_fallback else []
    tokens = list(dict.fromkeys(["<unk>", "<s>", "</s>", *fallback, *"▁helotwrdab", *("".join(m) for m in merges)]))
    tokens += [f"▁{chr(0x100 + i)}" for i in range(max(0, (size or 0) - len(tokens)))]  # decoded, never encoded
    tok = HfTokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, unk_token="<unk>",
                                 byte_fallback=byte_fallback, fuse_unk=fuse_unk))
    replace = normalizers.Replace(" ", "▁")
    if style == "metaspace":
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    else:
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), replace] if style == "llama2" else [replace])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     *([] if style == "gemma" else [decoders.Strip(" ", 1, 0)])])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<unk>", "<s>", "</s>")])
    tok.save(str(path))
    return len(tokens)


def smollm2_path():
    """The fetched SmolLM2-135M-Instruct directory, or fail saying how to fetch it (never skip)."""
    from tl_lab.engine.fetch import smollm2_dir

    path = smollm2_dir(quiet=True)
    if path is None:
        pytest.fail("SmolLM2 is not in the cache; run: python -m tl_lab fetch smollm2", pytrace=False)
    return path


# ------------------------------------------------------------------------------------------------
# The test command runs `-m "not hf"` (tools/quickstart.sh test): say what it left to the hf step
# ------------------------------------------------------------------------------------------------
_hf_deselected: set[str] = set()


def pytest_deselected(items):
    _hf_deselected.update(item.nodeid for item in items if item.get_closest_marker("hf"))


def pytest_sessionfinish(session):
    """Under `-n` each worker collects and deselects: it hands its hf tests to the controller."""
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["hf_deselected"] = sorted(_hf_deselected)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    _hf_deselected.update(getattr(node, "workeroutput", {}).get("hf_deselected", ()))


def pytest_terminal_summary(terminalreporter):
    """The lines tests left for the run's end (`record_property("summary", text)`: a worker's output is
    not shown under `-n`), then one naming the hf-marked tests this run deselected, and the command that
    runs them."""
    for rep in terminalreporter.stats.get("passed", []) + terminalreporter.stats.get("failed", []):
        for name, text in getattr(rep, "user_properties", ()):
            if name == "summary" and rep.when == "call":
                terminalreporter.write_line(text)
    if _hf_deselected:
        files = sorted({nodeid.split("::")[0] for nodeid in _hf_deselected})
        terminalreporter.write_line(
            f"{len(_hf_deselected)} hf tests (in {', '.join(f.removeprefix('tests/') for f in files)}) "
            "not run here: `bash tools/quickstart.sh hf` runs them (torch, transformers)")


def svg_outside(svg: str) -> list[str]:
    """The elements of a widget's SVG drawn (in part) outside its own width and height: each x, x1, x2
    and y, y1, y2 must lie in [0, width] and [0, height]. A misplaced bar or label a learner never sees."""
    import re

    box = re.search(r"<svg[^>]*\swidth='([\d.]+)'[^>]*\sheight='([\d.]+)'", svg)
    assert box, "no <svg width=... height=...>"
    width, height = float(box.group(1)), float(box.group(2))
    bad = []
    for element in re.findall(r"<(?:rect|text|line|circle)\b[^>]*>", svg):
        for name, value in re.findall(r"\s(x[12]?|y[12]?)='(-?[\d.]+)'", element):
            if not 0 <= float(value) <= (width if name[0] == "x" else height):
                bad.append(f"{name}={value} in {element[:90]}")
    return bad


def shown_text(html: str) -> str:
    """The text a widget's HTML shows: bold marks dropped (a bold word stays joined to what touches it),
    every other tag a space, entities decoded, runs of spaces one."""
    import html as html_module
    import re

    return " ".join(html_module.unescape(re.sub(r"<[^>]+>", " ", re.sub(r"</?b>", "", html))).split())


def joined_text(html: str) -> str:
    """The text of HTML with its tags removed and nothing in their place (a bit string drawn as a span
    per field reads as one piece), entities decoded."""
    import html as html_module
    import re

    return html_module.unescape(re.sub(r"<[^>]+>", "", html))


def outcomes(data) -> dict[str, str]:
    """A graded run's report (tl_lab.lab.exercise.plugin) -> node id: outcome."""
    return {r["nodeid"]: r["outcome"] for r in data["results"]}


def workspace(tmp_path, kind: str = "stub", modules=None):
    """An exercise workspace (tmp_path/ws) of stubs or of copies of the reference, for `modules`
    (default: all six)."""
    from tl_lab.lab.exercise.registry import MODULES
    from tl_lab.lab.exercise.stubs import reference_source, stub_source

    ws = tmp_path / "ws"
    ws.mkdir(parents=True, exist_ok=True)
    for m in MODULES if modules is None else modules:
        (ws / f"{m}.py").write_text(stub_source(m) if kind == "stub" else reference_source(m), encoding="utf-8")
    return ws


def in_workspace(ws, body: str) -> str:
    """`body` run in a fresh Python with the workspace `ws` active (as a section notebook's first cell
    makes it, `exercise.activate()`), tl_lab.quant asserted to be its file -> the last line printed."""
    import subprocess
    import sys

    from tl_lab.ops.paths import REPO_ROOT

    code = ("from tl_lab import exercise\n"
            "exercise.activate(quiet=True)\n"
            "import tl_lab.quant\n"
            "assert tl_lab.quant.__file__.startswith(exercise.active().workspace.as_posix())\n" + body)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env={**os.environ, "TL_LAB_WORKSPACE": str(ws)},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]
