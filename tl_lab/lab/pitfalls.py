"""The chapter's 22 pitfalls (section 5), each a real edit of the real code that a learner can switch on.

A pitfall is the chapter's mistake written as text replacements in named functions of tl_lab: the
correct text, found exactly once in the function, and the buggy text that replaces it. Switching it
on changes the code every caller runs, never a separate imitation of it:

    TL_LAB_PITFALL=s13 python -m pytest tests/test_runner.py::test_incremental_decode_equals_full_prefill
    TL_LAB_PITFALL=s13,s20 python -m tl_lab generate --model tiny-llama --prompt hello

`import tl_lab` reads TL_LAB_PITFALL and puts an import hook (`PitfallFinder`) in front of
`sys.meta_path`; every affected `tl_lab.*` module is then compiled from its own source with the
edits applied, under its real filename (tracebacks show the buggy line). When a correct text is not
found exactly once in its function, switching the pitfall on is refused with a PitfallError naming
it: the lab cannot drift silently as the code changes, and `check` in CI keeps every edit honest.

Inside a notebook an imported module cannot simply be swapped (other modules already hold its
functions), so the notebook runs broken code in a subprocess: `run_test` (one pytest node with the
pitfall on or off) and `probe` (a small measurement returning JSON, for the lab's pictures). In
process, `with switched_on("s13"):` imports every tl_lab module afresh for the block (the edited
ones patched) and puts the originals back after it.

Command line: `python -m tl_lab pitfalls` lists them, `python -m tl_lab pitfalls --check [ID ...]`
runs each pitfall's test off (must pass) and on (must fail).
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import hashlib
import json
import linecache
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tl_lab.errors import TlError
from tl_lab.lab.switch import SourceFinder

__all__ = [
    "ENV",
    "PITFALLS",
    "Edit",
    "Pitfall",
    "PitfallError",
    "PitfallFinder",
    "TestRun",
    "CheckRow",
    "get",
    "parse_ids",
    "patched_source",
    "function_diff",
    "install",
    "with_workspace",
    "switched_on",
    "active",
    "run_test",
    "check",
    "format_table",
    "probe",
    "PROBES",
]

ENV = "TL_LAB_PITFALL"
from tl_lab.ops.paths import PACKAGE_DIR, REPO_ROOT  # noqa: E402


class PitfallError(TlError):
    """A pitfall that cannot be switched on: an unknown id, or an edit whose correct text is not
    found exactly once in its function (the code moved: the registry needs updating)."""


@dataclass(frozen=True)
class Edit:
    """One replacement: in `function` of `module` ("Class.method" for a method), `correct` -> `buggy`."""

    module: str
    function: str
    correct: str
    buggy: str


@dataclass(frozen=True)
class Pitfall:
    """One row of the chapter's section 5, with the edit that makes it and the test that catches it.

    chapter_test: the chapter's name (section 4); test: our pytest node id; edits: the mistake (the
    first edit is in the engine path, further ones keep a readable reference in step with it);
    notebook, cell: where a notebook also shows the symptom (None when only the test does);
    probe: the name of the picture in PROBES that draws the symptom from the broken code, or None.
    """

    id: str
    mistake: str
    symptom: str
    chapter_test: str
    test: str
    edits: tuple[Edit, ...]
    notebook: str | None = None
    cell: str | None = None
    probe: str | None = None

    @property
    def module(self) -> str:
        return self.edits[0].module

    @property
    def function(self) -> str:
        return self.edits[0].function

    @property
    def modules(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(e.module for e in self.edits))


def _p(id, mistake, symptom, chapter_test, test, edits, notebook=None, cell=None, probe=None) -> Pitfall:
    return Pitfall(id, mistake, symptom, chapter_test, test, tuple(Edit(*e) for e in edits), notebook, cell, probe)


_S = "tl_lab.sample"
_Q = "tl_lab.quant"
_M = "tl_lab.model"
_F = "tl_lab.forward"
_R = "tl_lab.runner"
_K = "tl_lab.kv"
_KE = "tl_lab.ops.kernels"
_T_SAMPLE = "tests/test_sample.py::test_"
_T_RUNNER = "tests/test_runner.py::test_"

PITFALLS: dict[str, Pitfall] = {p.id: p for p in [
    _p("s01", "Swapping the shifts of the two draws in uniform_f64",
       "uniforms that look fine and match nothing",
       "pcg32_reference_vectors", _T_SAMPLE + "pcg32_reference_vectors",
       [(_S, "Pcg32.uniform_f64",
         "return ((a >> 5) * 67108864 + (b >> 6))",
         "return ((a >> 6) * 67108864 + (b >> 5))")],
       "07_sampler", "3. A uniform double from two outputs"),
    _p("s02", "Seeding the sample stream on sequence 54 instead of the purpose id",
       "every seeded stream differs from Python's",
       "hand_example_sampling", _T_SAMPLE + "hand_example_sampling",
       [(_S, "stream",
         'return Pcg32(child_seed(seed, purpose), u64(purpose, "purpose"))',
         "return Pcg32(child_seed(seed, purpose), 54)")],
       "08_worked_examples", "1. One sampled token: u = 0.80209 and token 3"),
    _p("s03", "Taking the logprob after temperature",
       "logprobs change with T; OpenAI clients get wrong values",
       "sampler_matches_l81_golden", _T_SAMPLE + "sampler_matches_l81_golden",
       [(_S, "sample_trace",
         "token=t, logprob=(l[t] - M) - log_Z)",
         "token=t, logprob=(q[t] - q_max) - math.log(_lsum([math.exp(v - q_max) for v in q])))")],
       "07_sampler", "Four pitfalls, seen in numbers: s03, the logprob at every T"),
    _p("s04", "> instead of >= in the nucleus walk",
       "the token that reaches p is dropped",
       "top_p_keeps_the_crossing_token", _T_SAMPLE + "top_p_keeps_the_crossing_token",
       [(_S, "_top_p", "if c >= p:", "if c > p:")],
       "07_sampler", "Four pitfalls, seen in numbers: s04, four equal logits and top_p 0.5", probe="nucleus_edge"),
    _p("s05", "Walking the CDF in probability order",
       "correct distribution, different ids for the same seed",
       "sampler_matches_l81_golden", _T_SAMPLE + "sampler_matches_l81_golden",
       [(_S, "sample_trace",
         "    probs = _softmax(w, kept)\n",
         "    kept = sorted(kept, key=lambda i: -w[i])  # most probable first\n    probs = _softmax(w, kept)\n")],
       "07_sampler", "Four pitfalls, seen in numbers: s05, the same u in id order"),
    _p("s06", "Presence and frequency penalties over the prompt",
       "prompt words become unlikely in the answer",
       "penalties_follow_hf_and_openai_semantics", _T_SAMPLE + "penalties_follow_hf_and_openai_semantics",
       [(_S, "_penalise", "    for i in output:\n        counts[i]", "    for i in prompt + output:\n        counts[i]")],
       "07_sampler", "Four pitfalls, seen in numbers: s06 and s07, the penalties"),
    _p("s07", "Dividing negative logits by the repetition penalty",
       "repeated unlikely tokens become MORE likely",
       "penalties_follow_hf_and_openai_semantics", _T_SAMPLE + "penalties_follow_hf_and_openai_semantics",
       [(_S, "_penalise", "l[i] = l[i] / r if l[i] > 0 else l[i] * r", "l[i] = l[i] / r")],
       "07_sampler", "Four pitfalls, seen in numbers: s06 and s07, the penalties"),
    _p("s08", "Truncating instead of rounding to f16",
       "a drift of half an ulp per cached value",
       "f16_rounds_to_nearest_even", "tests/test_quant.py::test_f16_rounds_to_nearest_even",
       [(_Q, "f32_to_f16",
         "        h = x.astype(np.float16).view(np.uint16)\n",
         "        h = x.astype(np.float16).view(np.uint16)\n"
         "        h -= np.abs(h.view(np.float16).astype(np.float32)) > np.abs(x)\n"),
        (_Q, "explain_f32_to_f16", "h = field + r.result", "h = field + r.kept")],
       "08_worked_examples", "3. f16 rounding: the ties of section 3", probe="f16_drift"),
    _p("s09", "The odd column in the low nibble",
       "int4 files from your Python decode to noise",
       "int4_hand_example", "tests/test_quant.py::test_int4_hand_example",
       [(_Q, "pack_int4",
         "return nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)",
         "return nibbles[:, 1::2] | (nibbles[:, 0::2] << 4)"),
        (_Q, "_int4_pair_table",
         "np.stack([(lo ^ 8) - 8, (hi ^ 8) - 8], axis=1)",
         "np.stack([(hi ^ 8) - 8, (lo ^ 8) - 8], axis=1)")],
       "06_int4", "1. The hand example, step by step"),
    _p("s10", "Rounding int4 with the f32 scale, storing the f16 one",
       "some weights off by one level",
       "int4_hand_example", "tests/test_quant.py::test_int4_hand_example",
       [(_Q, "QLinear.quantize",
         "s = f16_to_f32(s_bits)[:, :, None]  # the stored value, widened back",
         "s = (np.abs(Wg).max(axis=2) / np.float32(7))[:, :, None]  # the f32 scale, not the stored one")],
       "06_int4", "1. The hand example, step by step; 5. The stored-scale pitfall (s10), made visible"),
    _p("s11", "data_offsets from the start of the file",
       "garbage weights",
       "safetensors_reader_rules",
       "tests/test_model.py::test_safetensors_reader_rules_offsets_count_from_the_data_buffer",
       [(_M, "SafeTensors.raw",
         "offset = self.layout.data_start + t.data_offsets[0]",
         "offset = t.data_offsets[0]")],
       "02_model_directory", "2. A safetensors file, byte by byte: the tensors read back"),
    _p("s12", "Reading BF16 as F16",
       "SmolLM2 weights come out wildly wrong",
       "safetensors_reader_rules",
       "tests/test_model.py::test_safetensors_reader_rules_bf16_and_f16_each_read_as_itself",
       [(_M, "SafeTensors._widening",
         "widen = _WIDEN[t.dtype]",
         'widen = _WIDEN["F16" if t.dtype == "BF16" else t.dtype]')],
       "02_model_directory", "4. Memory-mapped: opening reads only the header (the values read)", probe="bf16_read"),
    _p("s13", "RoPE positions relative to the step",
       "decode tokens all at position 0; output degrades after the prompt",
       "incremental_decode_equals_full_prefill", _T_RUNNER + "incremental_decode_equals_full_prefill",
       [(_F, "llama_forward",
         "cos, sin = rope_cos_sin(step.pos, c.head_dim, c.rope_theta)  # (N, D): RoPE at absolute pos(t)",
         "cos, sin = rope_cos_sin(step.pos - np.repeat(step.starts, np.diff(step.offsets)), c.head_dim, c.rope_theta)"
         "  # (N, D): RoPE at the position inside the step")],
       "05_forward", "7. Batch and chunk invariance (and 2. One layer, 5. The f16 bound, 6. the runner against Hugging Face)",
       probe="decode_vs_prefill"),
    _p("s14", "q_offset 0 for a decode step",
       "the new token sees only key 0",
       "incremental_decode_equals_full_prefill", _T_RUNNER + "incremental_decode_equals_full_prefill",
       [(_KE, "_attend_decode",
         "last[0] = starts[s]  # q_offset = p_s",
         "last[0] = 0  # q_offset = 0"),
        (_KE, "_attend_tiles",
         "last[i] = starts[s] + (t0 + i - firsts[s])  # q_offset = p_s",
         "last[i] = 0 + (t0 + i - firsts[s])  # q_offset = 0")],
       "05_forward", "4. Attention over the visible keys; 7. Batch and chunk invariance (and 2. One layer, 5. The f16 "
       "bound, 6. the runner against Hugging Face)", probe="decode_vs_prefill"),
    _p("s15", "K written to the V slab",
       "logits far from HF",
       "tiny_llama_logits_match_hf", _T_RUNNER + "tiny_llama_logits_match_hf",
       [(_F, "write_kv",
         "f32_to_f16(np.stack([k, v], axis=1))",
         "f32_to_f16(np.stack([v, k], axis=1))")],
       "05_forward", "1. One step's shapes (the keys read back from the pool); 5. The f16 bound; 6. the runner against "
       "Hugging Face", probe="hf_logits"),
    _p("s16", "Skipping the final norm",
       "logits scaled wrong",
       "tiny_llama_logits_match_hf", _T_RUNNER + "tiny_llama_logits_match_hf",
       [(_F, "lm_head", "h = rms_norm(x_last, weights.norm, c.rms_norm_eps)", "h = x_last")],
       "05_forward", "6. The chapter's central claim: the runner against Hugging Face", probe="hf_logits"),
    _p("s17", "Not giving temporary blocks back",
       "the pool drains a little per embedding call",
       "run_once_returns_its_blocks", _T_RUNNER + "run_once_returns_its_blocks",
       [(_R, "ModelRunner._run_temporary",
         "with temporary_tables(self.pool, lengths) as tables:",
         "for tables in [[self.pool.alloc(max(1, blocks_for(n, self.block_tokens))) for n in lengths]]:  # never given back")],
       "05_forward", "8. Refusals, and blocks that come back (run_once)",
       probe="pool_drain"),
    _p("s18", "Evicting the newest prefix instead of the oldest",
       "a useful recent prefix disappears early",
       "kv_pool_evicts_the_oldest_cached_block", "tests/test_kv.py::test_kv_pool_evicts_the_oldest_cached_block",
       [(_K, "KvPool.alloc",
         "b, _ = self._lru.popitem(last=False)  # the least recently released",
         "b, _ = self._lru.popitem(last=True)  # the most recently released")],
       "04_kv_pool", "5. The block map and the prefix-cache story: LRU eviction", probe="lru_eviction"),
    _p("s19", "Accepting a zero-block pool",
       "the first allocation fails far from the invalid configuration",
       "kv_pool_rejects_zero_capacity", "tests/test_kv.py::test_kv_pool_rejects_zero_capacity",
       [(_K, "KvCfg.validate",
         'as_int(self.n_blocks, "KvCfg.n_blocks", lo=1, error=KvError)  # a pool of no blocks is refused here',
         'as_int(self.n_blocks, "KvCfg.n_blocks", lo=0, error=KvError)  # zero blocks let through')],
       "04_kv_pool", "2. One buffer, many blocks (a zero-block pool refused)", probe="zero_pool"),
    _p("s20", "Reversing RoPE frequency order",
       "Llama logits differ from the reference",
       "tiny_llama_logits_match_hf", _T_RUNNER + "tiny_llama_logits_match_hf",
       [(_F, "rope_inv_freq",
         "return np.float32(1.0) / (np.float32(theta) ** exponent)",
         "return np.float32(1.0) / (np.float32(theta) ** exponent[::-1])")],
       "05_forward", "3. RoPE: pairs turning at their own speeds; 6. the runner against Hugging Face",
       probe="rope_freqs"),
    _p("s21", "Not checking token ids against the vocabulary",
       "an invalid id reaches the embedding lookup",
       "forward_refuses_bad_batches", _T_RUNNER + "forward_refuses_bad_batches",
       [(_R, "ModelRunner._check_tokens",
         "        bad = np.flatnonzero((toks < 0) | (toks >= c.vocab_size))  # every id inside the vocabulary\n"
         "        if bad.size:\n"
         '            raise BatchError(f"seq {i}: token {int(toks[bad[0]])} at index {int(bad[0])} "\n'
         '                             f"is outside the vocabulary [0, {c.vocab_size})")\n',
         "")],
       "05_forward", "8. Refusals, and blocks that come back (an id outside the vocabulary)", probe="bad_token"),
    _p("s22", "silu applied to the up projection",
       "close-looking, wrong logits",
       "tiny_llama_logits_match_hf", _T_RUNNER + "tiny_llama_logits_match_hf",
       [(_F, "llama_layer",
         "gate = silu(gu[:, :I])                                               # (N, I), silu on the GATE\n"
         "    x = x + linear(gate * gu[:, I:], layer.down_proj)",
         "gate = gu[:, :I]                                               # (N, I), no silu here\n"
         "    x = x + linear(gate * silu(gu[:, I:]), layer.down_proj)")],
       "05_forward", "2. One layer; 6. The chapter's central claim: the runner against Hugging Face; 9. Int4 weights",
       probe="hf_logits"),
]}


def get(pid: str) -> Pitfall:
    """The pitfall `pid` ("s01" .. "s22"), or PitfallError listing the known ids."""
    try:
        return PITFALLS[pid]
    except (KeyError, TypeError):
        raise PitfallError(f"unknown pitfall {pid!r}: the chapter's are {', '.join(PITFALLS)}") from None


def parse_ids(text: str) -> tuple[str, ...]:
    """"s13,s20" (spaces allowed, repeats dropped) -> ("s13", "s20"); PitfallError for an unknown id."""
    ids = [part.strip().lower() for part in str(text).split(",") if part.strip()]
    return tuple(dict.fromkeys(get(i).id for i in ids))


# ---------------------------------------------------------------------------------------------
# Applying edits to a module's source
# ---------------------------------------------------------------------------------------------


def module_path(module: str) -> Path:
    """The source file of a `tl_lab.*` module (found by name, without importing it)."""
    parts = module.split(".")
    if parts[0] != "tl_lab" or len(parts) < 2:
        raise PitfallError(f"pitfall edits live in tl_lab modules, got {module!r}")
    return PACKAGE_DIR.joinpath(*parts[1:]).with_suffix(".py")


def function_span(source: str, qualname: str) -> tuple[int, int] | None:
    """Character span [begin, end) of function `qualname` ("f" or "Class.method") in `source`, or None."""
    tree = ast.parse(source)
    body, node = tree.body, None
    for name in qualname.split("."):
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == name), None)
        if node is None:
            return None
        body = node.body
    lines = source.splitlines(keepends=True)
    begin = sum(len(s) for s in lines[: node.lineno - 1])
    end = sum(len(s) for s in lines[: node.end_lineno])
    return begin, end


def apply_edit(source: str, edit: Edit, pid: str) -> str:
    """`source` with `edit` applied inside its function; PitfallError unless found exactly once there."""
    span = function_span(source, edit.function)
    where = f"{edit.module}.{edit.function}"
    if span is None:
        raise PitfallError(f"pitfall {pid}: function {where} not found in {module_path(edit.module).name}; "
                           f"the code moved, update tl_lab/lab/pitfalls.py")
    begin, end = span
    body = source[begin:end]
    n = body.count(edit.correct)
    if n != 1:
        raise PitfallError(f"pitfall {pid}: the correct text {edit.correct!r} is found {n} times in {where} "
                           f"(exactly once needed); the code moved, update tl_lab/lab/pitfalls.py")
    return source[:begin] + body.replace(edit.correct, edit.buggy) + source[end:]


def patched_source(module: str, ids) -> str:
    """The source of `module` with the edits of pitfalls `ids` in it applied (checked, then compiled)."""
    path = module_path(module)
    source = path.read_text(encoding="utf-8")
    for pid in ids:
        for edit in get(pid).edits:
            if edit.module == module:
                source = apply_edit(source, edit, pid)
    try:
        compile(source, str(path), "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise PitfallError(f"pitfall(s) {', '.join(ids)}: {module} does not compile with the edit: {exc}") from None
    return source


def function_diff(pid: str) -> list[dict]:
    """Each edit of `pid` as a unified diff of its function: [{file, function, diff}], diff a list of
    lines starting with ' ', '-' (the correct code) or '+' (the buggy code)."""
    out = []
    for edit in get(pid).edits:
        source = module_path(edit.module).read_text(encoding="utf-8")
        begin, end = function_span(source, edit.function) or (0, 0)
        before = source[begin:end]
        after = apply_edit(source, edit, pid)[begin : end + len(edit.buggy) - len(edit.correct)]
        lines = list(difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=2))
        out.append({"file": f"tl_lab/{module_path(edit.module).name}", "function": edit.function,
                    "diff": [s for s in lines[2:] if not s.startswith("@@")]})
    return out


# ---------------------------------------------------------------------------------------------
# The import hook
# ---------------------------------------------------------------------------------------------


class PitfallFinder(SourceFinder):
    """Serves the patched source of each module the active pitfalls touch (first on sys.meta_path),
    under the module's real filename."""

    def __init__(self, ids: tuple[str, ...], sources: dict[str, str]):
        super().__init__({m: (str(module_path(m)), text) for m, text in sources.items()})
        self.ids = ids
        self.sources = sources


def active() -> tuple[str, ...]:
    """The pitfalls switched on in this process (empty when none)."""
    for f in sys.meta_path:
        if isinstance(f, PitfallFinder):
            return f.ids
    return ()


def numba_cache_dir(ids) -> Path:
    """A numba cache directory of its own for these pitfalls and these exact edits.

    numba keys its on-disk cache by source file and function, not by the code compiled; a patched
    kernel shares its file with the correct one, so it must be cached elsewhere or it would be
    served the correct machine code (or leave broken code for the normal runs). Only a pitfall that
    edits tl_lab.ops.kernels needs one: the other edits leave the kernel file as it is, and its normal
    cache is then the right code (and saves each such run a compile of every kernel)."""
    from tl_lab.ops.paths import cache_dir

    h = hashlib.sha256(repr([get(i).edits for i in ids]).encode()).hexdigest()[:12]
    return cache_dir() / "numba-pitfalls" / f"{'-'.join(ids)}-{h}"


def install(ids) -> tuple[str, ...]:
    """Switch pitfalls `ids` ("s13,s20" or a list) on in this process, before any tl_lab module that
    they edit is imported. Every edit is applied and compiled now, so a stale one fails here, naming
    its pitfall. Returns the ids."""
    ids = parse_ids(ids) if isinstance(ids, str) else parse_ids(",".join(ids))
    if not ids:
        return ()
    if active():
        if active() != ids:
            raise PitfallError(f"pitfalls {', '.join(active())} are already on in this process")
        return ids
    modules = dict.fromkeys(m for i in ids for m in get(i).modules)
    loaded = [m for m in modules if m in sys.modules]
    if loaded:
        raise PitfallError(f"pitfalls {', '.join(ids)}: {', '.join(loaded)} is already imported, so the edit "
                           f"could not reach it; set {ENV} before importing tl_lab")
    sources = {m: patched_source(m, ids) for m in modules}
    if _KE in modules:
        _set_numba_cache(str(numba_cache_dir(ids)))
    sys.meta_path.insert(0, PitfallFinder(ids, sources))
    return ids


# Modules no pitfall edits and that import none that is edited: they stay as they are inside
# `switched_on`, so their classes (the errors above all) are the same objects inside and outside.
_STAY = ("tl_lab", "tl_lab.errors", "tl_lab.ops.paths", "tl_lab.ops.checks", "tl_lab.lab.pitfalls")


def _tl_modules() -> dict:
    return {n: m for n, m in sys.modules.items() if n.startswith("tl_lab.") and n not in _STAY}


def _bind(name: str, module) -> None:
    """Make `module` (or nothing, when None) the attribute of its parent package, as import does."""
    parent, _, child = name.rpartition(".")
    if parent in sys.modules:
        if module is None:
            sys.modules[parent].__dict__.pop(child, None)
        else:
            setattr(sys.modules[parent], child, module)


@contextlib.contextmanager
def switched_on(ids):
    """Pitfalls `ids` on in THIS process, for the block only; yields the ids.

    Inside the block every tl_lab module is imported afresh (those the pitfalls edit from their
    patched source), so what is imported inside (`from tl_lab.runner import ModelRunner`) is the
    engine with the mistake in it, every module bound to the others' new copies. Names bound
    before the block still point at the correct modules: import inside the block. On exit the
    original module objects come back exactly as they were.
    """
    ids = parse_ids(ids if isinstance(ids, str) else ",".join(ids))
    if not ids or active():
        raise PitfallError("switched_on needs pitfall ids, and no pitfall already on in this process "
                           f"(on: {', '.join(active()) or 'none'})")
    modules = dict.fromkeys(m for i in ids for m in get(i).modules)
    finder = PitfallFinder(ids, {m: patched_source(m, ids) for m in modules})
    saved, numba_before = _tl_modules(), os.environ.get("NUMBA_CACHE_DIR")
    for name in saved:
        del sys.modules[name]
    if _KE in modules:
        _set_numba_cache(str(numba_cache_dir(ids)))
    sys.meta_path.insert(0, finder)
    try:
        yield ids
    finally:
        sys.meta_path.remove(finder)
        for name in _tl_modules():
            del sys.modules[name]
            _bind(name, None)
        for name in sorted(saved):  # parents first
            sys.modules[name] = saved[name]
            _bind(name, saved[name])
        for m in modules:  # the broken text must not linger in tracebacks of the correct code
            linecache.cache.pop(str(module_path(m)), None)
        _set_numba_cache(numba_before)


def _set_numba_cache(path: str | None) -> None:
    """NUMBA_CACHE_DIR (and numba's live config, when numba is imported already) to `path`."""
    if path is None:
        os.environ.pop("NUMBA_CACHE_DIR", None)
    else:
        os.environ["NUMBA_CACHE_DIR"] = path
    if "numba" in sys.modules:
        sys.modules["numba"].config.CACHE_DIR = path or ""


def install_from_env() -> tuple[str, ...]:
    """`install` the pitfalls named by TL_LAB_PITFALL (nothing when it is unset or empty)."""
    text = os.environ.get(ENV, "").strip()
    return install(text) if text else ()


def with_workspace(pitfall: str, workspace) -> PitfallError:
    """The refusal of pitfalls `pitfall` ("s19") asked for together with a learner's workspace named
    explicitly (TL_LAB_WORKSPACE, or `exercise.activate(workspace)`): a pitfall is an edit of the reference's
    text, so the learner's file would run without it."""
    return PitfallError(f"{ENV}={pitfall} does not combine with the workspace {workspace}: a pitfall edits the "
                        f"reference's code, not a learner's; unset {ENV}, or run without the workspace")


_ALLOWED = ("tl_lab.__main__", "tl_lab.errors")  # what the command line needs to report a bad TL_LAB_PITFALL


def refuse_imports(error: PitfallError) -> None:
    """Keep `error` (a bad TL_LAB_PITFALL) for `env_error` and raise it on any further tl_lab import."""
    from tl_lab.lab.switch import RefusingFinder

    sys.meta_path.insert(0, RefusingFinder(error, lambda name: name.startswith("tl_lab.") and name not in _ALLOWED))


def env_error() -> PitfallError | None:
    """The PitfallError a bad TL_LAB_PITFALL gave at `import tl_lab`, or None."""
    from tl_lab.lab.switch import refusal

    finder = refusal(PitfallError)
    return finder.error if finder else None


# ---------------------------------------------------------------------------------------------
# Running a test with a pitfall on or off, in a subprocess
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TestRun:
    """One pytest run of one node: outcome "passed", "failed", "error" (collection or setup failed),
    "skipped", "not run" or "timeout"; message: the failure's first lines; seconds: wall time."""

    __test__ = False  # not a pytest test class

    pitfall: str | None
    test: str
    outcome: str
    message: str
    seconds: float


def _env(ids) -> dict:
    """The environment of a run with pitfalls `ids` on: this process's, with TL_LAB_PITFALL set to `ids` (or
    unset), TL_LAB_WORKSPACE off, colour off and the clone first on PYTHONPATH; nothing else changes."""
    env = dict(os.environ)
    env.pop(ENV, None)
    # a pitfall is an edit of the reference: a learner's workspace would be graded in its place (was: with
    # TL_LAB_WORKSPACE set, `--check s18` ran their kv.py and said "NOT caught: off failed, on failed")
    env["TL_LAB_WORKSPACE"] = "off"
    # a notebook kernel sets FORCE_COLOR, which makes pytest colour even its report; plain text here
    env.pop("FORCE_COLOR", None)
    env["PY_COLORS"] = "0"
    if ids:
        env[ENV] = ",".join(ids)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


def _outcome(xml_path: Path) -> tuple[str, str]:
    """(outcome, message) of the single test case in a junit xml report."""
    try:
        root = ET.parse(xml_path).getroot()
    except (OSError, ET.ParseError):
        return "not run", "pytest wrote no report"
    cases = root.iter("testcase")
    worst, message = None, ""
    rank = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}
    for case in cases:
        for tag, name in (("error", "error"), ("failure", "failed"), ("skipped", "skipped")):
            node = case.find(tag)
            if node is not None:
                break
        else:
            name, node = "passed", None
        if worst is None or rank[name] > rank[worst]:
            worst = name
            message = "" if node is None else (node.get("message") or "") + "\n" + (node.text or "")
    if worst is None:
        errors = [e.get("message", "") for e in root.iter("error")]
        return ("error", errors[0]) if errors else ("not run", "no test collected")
    return worst, message.strip()


# One test needs none of these: nbval alone costs seconds of imports per run (jsonschema formats).
_QUIET_PLUGINS = ("-p", "no:cacheprovider", "-p", "no:nbval", "-p", "no:hypothesispytest", "-p", "no:anyio")


def run_test(test: str, pitfall: str | None = None, timeout: float = 600.0) -> TestRun:
    """Run pytest node `test` in a subprocess with `pitfall` ("s13", "s13,s20") on, or off (None)."""
    ids = parse_ids(pitfall) if pitfall else ()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tl-pitfall-") as tmp:
        report = Path(tmp) / "report.xml"
        cmd = [sys.executable, "-m", "pytest", test, "-q", "--tb=short", f"--junitxml={report}", *_QUIET_PLUGINS]
        try:
            subprocess.run(cmd, cwd=REPO_ROOT, env=_env(ids), capture_output=True, text=True, timeout=timeout)
            outcome, message = _outcome(report)
        except subprocess.TimeoutExpired:
            outcome, message = "timeout", f"no verdict within {timeout:.0f} s"
    return TestRun(",".join(ids) or None, test, outcome, _shorten(message), time.perf_counter() - t0)


def _shorten(message: str, lines: int = 14, width: int = 160) -> str:
    out = [s[:width] for s in message.splitlines()[:lines]]
    return "\n".join(out)


@dataclass(frozen=True)
class CheckRow:
    """One pitfall's verdict: its test passed with the pitfall off and failed with it on."""

    id: str
    test: str
    off: TestRun
    on: TestRun

    @property
    def caught(self) -> bool:
        return self.off.outcome == "passed" and self.on.outcome == "failed"

    @property
    def seconds(self) -> float:
        return self.off.seconds + self.on.seconds


def check(ids=None, jobs: int = 2, progress=None) -> list[CheckRow]:
    """Run each pitfall's test off (once per distinct test) and on, `jobs` subprocesses at a time.

    progress: called with each finished TestRun (for a live printout)."""
    ids = tuple(PITFALLS) if not ids else parse_ids(",".join(ids))
    tests = list(dict.fromkeys(get(i).test for i in ids))

    def run(args):
        res = run_test(*args)
        if progress is not None:
            progress(res)
        return res

    jobs_list = [(t, None) for t in tests] + [(get(i).test, i) for i in ids]
    with ThreadPoolExecutor(max_workers=max(1, int(jobs))) as pool:
        results = list(pool.map(run, jobs_list))
    off = dict(zip(tests, results[: len(tests)]))
    return [CheckRow(i, get(i).test, off[get(i).test], r) for i, r in zip(ids, results[len(tests):])]


def format_table(rows: list[CheckRow]) -> str:
    """The check as a text table: id, test, off, on, seconds (of the run with the pitfall on), and a
    last line "N of M caught"."""
    head = f"{'id':<4} {'test':<66} {'off':<7} {'on':<7} {'seconds':>7}  caught"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r.id:<4} {r.test.split('::')[-1][:66]:<66} {r.off.outcome:<7} {r.on.outcome:<7} "
                     f"{r.on.seconds:7.1f}  {'yes' if r.caught else 'NO'}")
    lines.append(f"{sum(r.caught for r in rows)} of {len(rows)} caught")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Probes: the symptom measured on the code as it is in this process (run in a subprocess for "on")
# ---------------------------------------------------------------------------------------------


def _tiny_runner(n_blocks: int = 64):
    from tl_lab.ops.paths import DATA_DIR
    from tl_lab.runner import EngineConfig, KvConfig, ModelRunner

    return ModelRunner.load(DATA_DIR / "tiny-llama", EngineConfig(kv=KvConfig(n_blocks=n_blocks)))


def _probe_f16_drift() -> dict:
    """f16(x) - x in ulps of f16 for 20,000 values in [1, 2): rounding stays within +-1/2 around 0,
    truncation lies in (-1, 0] with a mean of -1/2 (the drift)."""
    import numpy as np

    from tl_lab.quant import f16_to_f32, f32_to_f16

    x = np.random.default_rng(0).uniform(1.0, 2.0, 20_000).astype(np.float32)
    err = (f16_to_f32(f32_to_f16(x)).astype(np.float64) - x) / 2.0**-10
    counts, edges = np.histogram(err, bins=40, range=(-1.0, 1.0))
    return {"counts": counts.tolist(), "edges": edges.tolist(), "mean_ulp": float(err.mean()),
            "min_ulp": float(err.min()), "max_ulp": float(err.max())}


def _probe_bf16_read() -> dict:
    """The first 400 values of the bundled tiny Llama's BF16 embedding, as the reader returns them."""
    import numpy as np

    from tl_lab.model import SafeTensors
    from tl_lab.ops.paths import DATA_DIR

    with SafeTensors.open(DATA_DIR / "tiny-llama" / "model.safetensors") as f:
        w = f.f32("model.embed_tokens.weight").reshape(-1)[:400]
    finite = np.isfinite(w)
    return {"values": np.where(finite, w, np.nan).tolist(), "max_abs": float(np.abs(w[finite]).max()),
            "non_finite": int((~finite).sum())}


def _probe_decode_vs_prefill() -> dict:
    """Prefill 10 prompt tokens, then decode 14 one per step; at each step the max |logit| gap to a
    full prefill of the same tokens (run_once). The correct code stays near 0 all the way."""
    import numpy as np

    from tl_lab.engine.blocks import blocks_for
    from tl_lab.runner import ForwardBatch, ForwardSeq

    runner = _tiny_runner()
    tokens, n_prompt = list(b"The KV cache holds keys."), 10
    blocks = runner.pool.alloc(blocks_for(len(tokens), runner.block_tokens))
    gaps = []
    z = runner.forward(ForwardBatch([ForwardSeq(tokens[:n_prompt], 0, blocks)])).row(0)
    for t in range(n_prompt, len(tokens) + 1):
        _, ref = runner.run_once(tokens[:t])
        gaps.append(float(np.abs(z - ref).max()))
        if t < len(tokens):
            z = runner.forward(ForwardBatch([ForwardSeq(tokens[t : t + 1], t, blocks)])).row(0)
    return {"positions": list(range(n_prompt - 1, len(tokens))), "gaps": gaps, "n_prompt": n_prompt}


def _probe_hf_logits() -> dict:
    """max |z - z_HF| for each golden prompt of the tiny Llama, with the chapter's bound (1e-3 of
    the largest HF logit)."""
    from tl_lab.lab.compare import against_hf

    return against_hf(_tiny_runner())


def _probe_pool_drain() -> dict:
    """Free blocks of a 32-block pool after each of ten run_once calls on a 20-token prompt."""
    from tl_lab.errors import KvError

    runner = _tiny_runner(n_blocks=32)
    free = [runner.pool.stats()["free"]]
    for _ in range(10):
        try:
            runner.run_once(list(range(20)))
        except KvError:  # the drained pool refuses: that is where the symptom ends
            break
        free.append(runner.pool.stats()["free"])
    return {"free": free, "n_blocks": 32}


def _probe_lru_eviction() -> dict:
    """Six blocks, four of them cached and released in the order 2, 0, 3, 1; then one alloc at a
    time: which block each one takes (the correct pool evicts 2, 0, 3, 1 after the two free ones)."""
    from tl_lab.kv import KvCfg, KvPool, prefix_hash

    pool = KvPool(KvCfg(6, 4, 1, 1, 4))
    ids = pool.alloc(4)
    for b in ids:
        pool.set_fill(b, 4)
        pool.register(b, prefix_hash(None, [b] * 4))
    for b in (2, 0, 3, 1):
        pool.release(b)
    lru = pool.lru()
    taken, states = [], []
    for _ in range(6):
        taken.append(pool.alloc(1)[0])
        states.append([str(pool.state(b)) for b in range(6)])
    return {"lru": lru, "taken": taken, "states": states}


def _probe_rope_freqs() -> dict:
    """RoPE's inverse frequencies of the tiny Llama's heads (D and theta from its config)."""
    from tl_lab.forward import rope_inv_freq
    from tl_lab.model import ModelConfig
    from tl_lab.ops.paths import DATA_DIR

    c = ModelConfig.load(DATA_DIR / "tiny-llama")
    return {"inv_freq": rope_inv_freq(c.head_dim, c.rope_theta).tolist(), "theta": c.rope_theta}


def _probe_nucleus_edge() -> dict:
    """Four equal logits (p = 0.25 each) and top_p = 0.5: the kept set and 400 seeded draws."""
    import numpy as np

    from tl_lab.sample import SamplingParams, sample, sample_trace, stream

    x = np.array([5.0, 5.0, 5.0, 5.0, -100.0], np.float32)
    params = SamplingParams(top_p=0.5)
    tr = sample_trace(x, params, [], [], stream(0, 4))
    draws = [sample(x, params, [], [], stream(s, 4))[0] for s in range(400)]
    return {"cum": tr.nucleus_cum.tolist(), "kept": tr.top_p.tolist(),
            "counts": np.bincount(draws, minlength=5).tolist(), "p": 0.5}


def _probe_zero_pool() -> dict:
    """A pool of zero blocks: where is it refused, and with what message?"""
    from tl_lab.errors import KvError
    from tl_lab.kv import KvCfg, KvPool

    try:
        pool = KvPool(KvCfg(0, 16, 1, 1, 4))
    except KvError as exc:
        return {"refused_at": "KvPool(KvCfg(n_blocks=0, ...))", "error": str(exc)}
    try:
        pool.alloc(1)
    except KvError as exc:
        return {"refused_at": "pool.alloc(1), later", "error": str(exc)}
    return {"refused_at": None, "error": ""}


def _probe_bad_token() -> dict:
    """A forward of [5, 256] (the tiny vocabulary is 256) and of [5, -1]: refused, crashed or run?"""
    from tl_lab.runner import ForwardBatch, ForwardSeq

    runner = _tiny_runner(n_blocks=4)
    blocks = runner.pool.alloc(1)
    out = {}
    for name, tokens in (("[5, 256]", [5, 256]), ("[5, -1]", [5, -1])):
        try:
            runner.forward(ForwardBatch([ForwardSeq(tokens, 0, blocks)]))
            out[name] = {"raised": None, "error": "ran: logits from a wrapped-around embedding row"}
        except Exception as exc:  # noqa: BLE001  (what the broken code raises is the measurement)
            out[name] = {"raised": type(exc).__name__, "error": str(exc)[:160]}
    return out


PROBES = {
    "f16_drift": _probe_f16_drift,
    "bf16_read": _probe_bf16_read,
    "decode_vs_prefill": _probe_decode_vs_prefill,
    "hf_logits": _probe_hf_logits,
    "pool_drain": _probe_pool_drain,
    "lru_eviction": _probe_lru_eviction,
    "rope_freqs": _probe_rope_freqs,
    "nucleus_edge": _probe_nucleus_edge,
    "zero_pool": _probe_zero_pool,
    "bad_token": _probe_bad_token,
}


def probe(name: str, pitfall: str | None = None, timeout: float = 120.0) -> dict:
    """Probe `name` measured with `pitfall` on, in a subprocess (the JSON it prints), or off.

    Off runs in a subprocess too, so the answer never depends on what this process imported."""
    if name not in PROBES:
        raise PitfallError(f"unknown probe {name!r}: known are {', '.join(PROBES)}")
    ids = parse_ids(pitfall) if pitfall else ()
    code = f"import json, tl_lab.lab.pitfalls as p; print(json.dumps(p.PROBES[{name!r}]()))"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=_env(ids), capture_output=True,
                          text=True, timeout=timeout)
    if done.returncode != 0:
        raise PitfallError(f"probe {name} with {pitfall or 'no pitfall'} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------
# Command line: python -m tl_lab pitfalls [--check [ID ...]]
# ---------------------------------------------------------------------------------------------


def add_cli(sub) -> None:
    """Add the `pitfalls` subcommand to the argparse subparsers of tl_lab.__main__."""
    p = sub.add_parser("pitfalls", help="list the chapter's 22 pitfalls, or check each is caught", description=(
        "List the pitfalls of section 5 (id, module, test, symptom). With --check, run each "
        "pitfall's test with it off (must pass) and on (must fail), one pytest subprocess per "
        "run; exit 0 only when every pitfall asked for is caught. Switch one on anywhere with "
        f"{ENV}=s13 (comma-separated ids allowed)."))  # fmt: skip
    p.add_argument("--check", nargs="*", metavar="ID", help="check these pitfalls (all when none given)")
    p.add_argument("--jobs", type=int, default=2, metavar="N", help="subprocesses at a time (default 2)")
    p.set_defaults(run=cli)


def cli(args) -> int:
    if args.check is None:
        for p in PITFALLS.values():
            print(f"{p.id}  {p.module:<14} {p.test.split('::')[-1]:<58} {p.symptom}")
        return 0
    try:
        ids = parse_ids(",".join(args.check)) if args.check else tuple(PITFALLS)
    except PitfallError as exc:  # an id the user typed, not a pitfall that failed: exit 2, not "not caught"'s 1
        raise ValueError(f"--check: {exc}") from None
    if args.check and not ids:  # `--check ""` (an unset shell variable): not a request for all 22
        raise ValueError(f"--check: no pitfall id in {' '.join(map(repr, args.check))}; give ids such as s13, or none for all")
    if args.jobs < 1:  # a bad argument: exit 2 like argparse's own (ValueError is a usage error)
        raise ValueError(f"--jobs must be at least 1, got {args.jobs}")
    t0 = time.perf_counter()

    def progress(r: TestRun) -> None:
        print(f"  {r.pitfall or 'off':<7} {r.test.split('::')[-1]:<58} {r.outcome:<7} {r.seconds:5.1f} s",
              file=sys.stderr, flush=True)

    rows = check(ids, jobs=args.jobs, progress=progress)
    print(format_table(rows))
    print(f"total {time.perf_counter() - t0:.0f} s with {args.jobs} job(s)")
    for r in rows:
        if not r.caught:
            print(f"\n{r.id} NOT caught: off {r.off.outcome}, on {r.on.outcome}\n{r.on.message or r.off.message}")
    return 0 if all(r.caught for r in rows) else 1
