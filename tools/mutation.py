"""Mutation testing of tl_lab: how many of the mistakes a developer makes do the tests catch?

Two kinds of mutants, both scored as killed / (killed + survived):

* Python modules: mutmut (pip install mutmut; 3.8.1 was used) mutates one module at a time in a
  scratch copy of the tree (`git archive REF`), with that module's own fast test files only, one
  worker (`--max-children 1`: the machine is shared). With `--sample N` a seeded random N of the
  module's mutants is run and the result says so; otherwise all of them.
* The compiled kernels (kernels.py, lanes.py): mutmut's trampolines cannot enter a numba loop, so
  KERNEL_MUTANTS is a short hand-written list of text edits, each applied to a scratch copy and run
  against tests/test_kernels.py and tests/test_lanes.py.

    python tools/mutation.py --label before --ref main --sample 40 kv blocks
    python tools/mutation.py --label after --kernels

Each run merges its scores into benchmarks/results/mutation.json under results[label][module],
with the survivors' names and diffs (mutmut show) so they can be read and closed or called
equivalent, and the machine it ran on under machines[label] (`machine`: the last run's).
tools/mutation.sh is the rerun of the whole measurement. The README's table of scores is written
from the results by `python benchmarks/mutation_table.py --write`, its rows chosen there (SHOWN).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results" / "mutation.json"
SCRATCH = Path(os.environ.get("TL_LAB_MUTATION_DIR", "/tmp/tl_lab-mutation"))

_EXERCISE_IN_PROCESS = " or ".join((
    "catalogue", "stubs_are", "registry_name", "every_stub_imports", "untouched_stub", "projects_own", "start_twice",
    "bad_input_is", "unreadable_or", "written_counts", "every_section_notebook",
    "does_not_import", "learner_lines_are", "only_a_docstring", "parametrized_id", "the_workspace_is_the_one",
    "origins_say", "tests_command_lists", "in_process"))
"""The exercise tests that run in this process or in one started from the clone: mutmut's trampolines in
a process started elsewhere cannot find their setup.cfg (the graded runs, a notebook's kernel, a check from
another folder are left to the test command)."""

_EXERCISE_FILES = [f"tests/test_exercise_{m}.py" for m in ("cli", "grading", "guard", "parity", "plugin", "side", "workspace")]
"""Each exercise module's in-process tests (tests/test_exercises.py holds the rest, the graded runs among them)."""


# module -> its fast test selection: the tests a developer runs after touching it.
MODULES = {
    "kv": ["tests/test_kv.py"],
    "blocks": ["tests/test_blocks.py"],
    "sample": ["tests/test_sample.py"],
    "quant": ["tests/test_quant.py"],
    # the reader, the config and the loader; not the fuzzers (minutes under mutmut's trampolines) nor
    # the subprocess that imports a fresh tl_lab
    "model": ["tests/test_model.py", "-m", "not hf and not smollm2", "-k", "not random and not imports_no"],
    "generate": ["tests/test_generate.py", "-m", "not hf and not smollm2"],
    "tokenizer": ["tests/test_tokenizer.py", "-m", "not hf and not smollm2"],
    "fetch": ["tests/test_fetch.py"],
    # the runner's batches and checks; not the hf comparisons nor SmolLM2
    "runner": ["tests/test_runner.py", "-m", "not hf and not smollm2"],
    # the Llama forward (a learner's module): its own tests and the runner's, which run it whole
    "forward": ["tests/test_forward.py", "tests/test_runner.py", "-m", "not hf and not smollm2"],
    # the numpy products (the reference the kernels are held to), the int8 head, the comparisons
    "products": ["tests/test_products.py"],
    "q8": ["tests/test_q8.py"],
    "compare": ["tests/test_compare.py"],
    # what the machine is (the figures every speed choice starts from), and BLAS's threads
    "machine": ["tests/test_machine.py"],
    "tuning": ["tests/test_tuning.py"],
    # a long prefill as two overlapped stages (the same bits), the fp8 numbers, the input checks every
    # module's errors go through, and the load's parallel widening (run by the reader's tests)
    "pipeline": ["tests/test_pipeline.py"],
    "fp8": ["tests/test_fp8.py"],
    "checks": ["tests/test_checks.py", "tests/test_quant.py", "tests/test_sample.py", "tests/test_runner.py",
               "-m", "not hf and not smollm2"],
    "widening": ["tests/test_widening.py", "tests/test_model.py", "-m", "not hf and not smollm2",
                 "-k", "not random and not imports_no"],
    # the sampler as plain loops (the reference the learner's sampler is held to), config.json's
    # schema, and the kernels' lazy entry points
    "ops.fast_sample": ["tests/test_sample.py"],
    "schema": ["tests/test_schema.py", "tests/test_model.py", "-m", "not hf and not smollm2",
               "-k", "not random and not imports_no"],
    "lazy_kernels": ["tests/test_lazy_kernels.py"],
    # where the data and the model cache are and how a file is opened; the refusals' clipped messages
    "paths": ["tests/test_paths.py"],
    # the chapter's 22 mistakes: their registry, the edits, switching them on, a test's verdict, the
    # probes the pitfall lab draws; not the check of all 22 (80 s, each pitfall's test in a process of its own)
    "pitfalls": ["tests/test_pitfalls.py", "tests/test_widgets_pitfalls.py", "-k", "not every_pitfall_is_caught"],
    # the import hook that serves a pitfall's edited reference or a learner's file; not the check of all 22
    # (each pitfall's test in a process of its own, which a mutant in this process does not reach)
    "switch": ["tests/test_switch.py", "tests/test_pitfalls.py", "-k", "not every_pitfall_is_caught"],
    # the widgets: what a learner sees after any order of clicks
    "widgets.blockmap": ["tests/test_widgets_blockmap.py"],
    "widgets.int4": ["tests/test_widgets_int4.py"],
    "widgets.numbers": ["tests/test_widgets_numbers.py"],
    "widgets.common": ["tests/test_widgets_common.py", "tests/test_widgets_sampler.py"],  # its charts' users
    "widgets.checkpoint": ["tests/test_widgets_checkpoint.py"],
    "widgets.enginesteps": ["tests/test_widgets_enginesteps.py"],
    "widgets.exercise": ["tests/test_widgets_exercise.py"],
    "widgets.pitfalls": ["tests/test_widgets_pitfalls.py"],
    # the sampler's three modules share one test file; its SmolLM2 test is a second's run of the
    # fetched model, kept: it is the one that drives the playground on a real vocabulary
    "widgets.sampler_charts": ["tests/test_widgets_sampler.py"],
    "widgets.sampler_playground": ["tests/test_widgets_sampler.py"],
    "widgets.model_playground": ["tests/test_widgets_sampler.py"],
    "errors": ["tests/test_errors.py"],
    # the exercise's modules: the exercise tests started from the clone (_EXERCISE_IN_PROCESS); the
    # graded runs and the guard's trials happen in processes of their own
    **{f"exercise.{m}": ["tests/test_exercises.py", *_EXERCISE_FILES, "-m", "not exercise_slow", "-k", _EXERCISE_IN_PROCESS]
       for m in ("stubs", "registry", "workspace", "cli", "grading", "gradebook", "guard", "parity", "side", "plugin")},
}

# (name, file, old text, new text): each a mistake a later refactor of a compiled loop could make.
KERNEL_MUTANTS = [
    ("int4 zero point -7 s instead of -8 s (the AVX-512 table)", "tl_lab/ops/lanes.py",
     "[float(n - 8) for n in range(LANES)]", "[float(n - 7) for n in range(LANES)]"),
    ("int4 high nibble read with shift 0", "tl_lab/ops/kernels.py",
     "return grp * half + c - half, 4", "return grp * half + c - half, 0"),
    ("softmax without the maximum subtracted", "tl_lab/ops/kernels.py", "vsplat(-top)", "vsplat(np.float32(0.0))"),
    ("causal mask: each query sees one key too many", "tl_lab/ops/kernels.py",
     "last[i] = starts[s] + (t0 + i - firsts[s])  # q_offset", "last[i] = starts[s] + (t0 + i - firsts[s]) + 1  # q_offset"),
    ("weighted sum drops the last value", "tl_lab/ops/kernels.py",
     "            for j in range(n):\n                r = v0 + j",
     "            for j in range(n - 1):\n                r = v0 + j"),
    ("the last block of four features repeats the wrong row", "tl_lab/ops/kernels.py",
     "min(n0 + 3, last)", "min(n0 + 2, last)"),
    ("matvec_f32 skips the last step of sixteen columns", "tl_lab/ops/kernels.py",
     "for k in range(0, K, LANES):\n                _prefetch_rows(W, n0 + F32_AHEAD, 4, k)\n                xv = vload(x, m, k)",
     "for k in range(0, K - LANES, LANES):\n                _prefetch_rows(W, n0 + F32_AHEAD, 4, k)\n                xv = vload(x, m, k)"),
    ("matvec1_f32 skips the last step of sixteen columns", "tl_lab/ops/kernels.py",
     "for k in range(0, K, LANES):\n                a = vfma(vload(x, m, k), vload(W, n, k), a)",
     "for k in range(0, K - LANES, LANES):\n                a = vfma(vload(x, m, k), vload(W, n, k), a)"),
    ("matvec1_q8 scales every group by the first group's scale", "tl_lab/ops/kernels.py",
     "s = _scale(f16, S, n, grp)", "s = _scale(f16, S, n, 0)"),
    ("scores64 reads its fourth sixteen keys from the third's columns", "tl_lab/ops/kernels.py",
     "vload(kT, k0 + d, c + 3 * LANES)", "vload(kT, k0 + d, c + 2 * LANES)"),
    ("masked loads take one lane too many", "tl_lab/ops/lanes.py",
     'builder.icmp_signed("<", lane, ends)', 'builder.icmp_signed("<=", lane, ends)'),
    ("the fold adds the lower half to itself", "tl_lab/ops/lanes.py",
     "list(range(n, 2 * n))", "list(range(0, n))"),
    ("matmul8_f32 in halves: rows 4 .. 7 multiplied by x's rows 0 .. 3", "tl_lab/ops/kernels.py",
     "lo4 = _quad2h(x4, x5, x6, x7,", "lo4 = _quad2h(x0, x1, x2, x3,"),
    ("matmul8_f32 in halves: the second feature's kept sums read back from the first's rows", "tl_lab/ops/kernels.py",
     "_kept4h(kept, i + 8, h, c0)", "_kept4h(kept, i, h, c0)"),
    ("matmul8_f32 in halves: each pass skips its last step of sixteen columns", "tl_lab/ops/kernels.py",
     "for k in range(c0 + h, c1, LANES):", "for k in range(c0 + h, c1 - LANES, LANES):"),
    ("matmul8_f32's column passes: every pass stores its sums, none kept for the next", "tl_lab/ops/kernels.py",
     "_keep_or_store82(part, nb, y, n0, a, b, c1 < K)", "_keep_or_store82(part, nb, y, n0, a, b, False)"),
    ("the next block's keys not prefetched (speed only: an equivalent mutant)", "tl_lab/ops/kernels.py",
     "if (blk + 1) * B < L:", "if False:"),
    ("attention's keys: sixteen transposed straight from a block that holds fewer", "tl_lab/ops/kernels.py",
     "slot + LANES <= B:", "slot + LANES <= 2 * B:"),
    ("the transpose reads f16 bits as float32", "tl_lab/ops/lanes.py", "            if bits:", "            if False:"),
]


# Survivors read and judged equivalent (no test can or should tell them apart), or left on purpose.
# (module, the change, why). The survivors a user would suffer from were closed with tests instead.
EQUIVALENT = [
    ("blocks", "BlockManager.fill: `hash_of(b) is None and fill(b) < want` -> `or`",
     "a registered block is full, and the runner never writes inside one (a cached prompt's last block "
     "is recomputed at want = B), so set_fill(b, B) on it changes nothing"),
    ("kv", "KvPool.export: `payload[...] = self._data[blocks]` -> None",
     "the big-endian branch: on a little-endian machine np.take gathers straight into place and this "
     "line never runs"),
    ("quant", "_bits16: `h.dtype.kind not in \"iu\"` -> `not in \"XXiuXX\"`",
     "a dtype's kind is one letter, and no kind is X"),
    ("quant", "_int4_pair_table: any change to its table (s43: the low nibble's value - 9 for - 8)",
     "the table is built once at import, before mutmut switches a mutant on (as the entry below)"),
    ("quant", "_int4_pair_table: `lo, hi = byte & 0xF, byte >> 4` -> None",
     "runs once at import, before mutmut switches a mutant on; any import of the module would fail"),
    ("sample", "_exp_battery: a constant of the exp self-check changed (-0.693.. -> -1.693.., arange from 2)",
     "the battery's inputs, not the sampler's: the check still compares numpy's exp with math.exp on "
     "thousands of other values"),
    ("sample", "exp_backend: `_EXP_BACKEND = \"numpy\"` (or \"compiled\") -> None",
     "speed only: every backend it admits gives math.exp's bits (tested); None asks again on every call"),
    ("model", "_parallel_for: helper threads `range(1, n)` -> `range(2, n)`",
     "speed only: one widening thread fewer; the bits do not depend on the thread count (tested)"),
    ("model", "stack_linears: end-to-end test `==` -> `!=`",
     "memory only on this path: parts that are not end to end are concatenated, giving the same values"),
    ("fetch", "build_config: `vocab_size` read from another key (falls back to the token count)",
     "the converter also checks the tokenizer's size equals vocab_size, so both agree on every GGUF it accepts"),
    ("fetch", "build_config: pad_token_id, _write_manifest: conversion_seconds key",
     "informational fields the engine never reads"),
    ("fetch", "tensor_plan: the sort key of a layer's tensors",
     "file order only: the reader sorts by offset and the loader finds tensors by name"),
    ("blocks", "BlockManager.fill: `fill(b) < want` -> `<=`",
     "set_fill(b, want) on a block already at want changes nothing"),
    ("blocks", "BlockManager.fill: the loop from block 0, not from start // B",
     "speed only: the blocks before start are full (a start past the written fill is refused), so "
     "want = B and nothing changes; it visits every earlier block each step"),
    ("fetch", "_install / _remove_stale_temps / extract_gguf: ignore_errors, missing_ok, exist_ok made falsy",
     "they differ only when a removal fails or races with another process (a path no test makes): "
     "left, an error path"),
    ("fetch", "_mb: n / 1e6 -> n / 1000001.0",
     "a progress figure at one decimal: the same text for every size but one in a million"),
    ("fetch", "_obtain_wheel, _say: a progress line's text, its flush",
     "progress lines on stdout, not the outcome; left untested on purpose"),
    ("fetch", "_write_manifest: the gguf_sha256 key; build_config: rope_scaling's key, tl_source's license fallback",
     "informational fields the engine never reads (rope_scaling absent is None, as written)"),
    ("fetch", "build_tokenizer: post_processor = None",
     "the ByteLevel post-processor only fixes offsets; ids and text are the same"),
    ("fetch", "write_safetensors: the arithmetic of the size check's message",
     "an internal consistency check of the writer's own two sums, which agree by construction"),
    ("sample", "_exp_battery: another constant, or the specials None (the battery would raise)",
     "the battery runs once per process and mutmut's forked runs inherit its cached answer; a fresh "
     "process that samples (tests/test_cli.py) runs it; its inputs are the check's, not the sampler's"),
    ("sample", "_nucleus: the candidate window grows 9x instead of 8x",
     "speed only: the window grows until its mass reaches p, whatever the factor; the same ids"),
    ("model", "_header_pieces: the default overlap 0 -> 1",
     "the header's copy writes each piece at its own offset, so the one byte of overlap is written "
     "twice with the same value"),
    ("model", "_check_llama: head_dim checked against d / H instead of d // H",
     "d % H is refused just before, so d / H is the integer d // H"),
    ("model", "_check_tensor_count's arithmetic and its message; _check_llama's 'RoPE' in a message",
     "left: killed by tests/test_hardening.py, outside model's fast selection (a full run kills them)"),
    ("forward", "silu: `np.divide(g, e, out=e)` -> `out=None`",
     "memory only: the quotient goes into a new array instead of exp's buffer; the same values"),
    ("forward", "PoolKv.attend: the kernel's `tail` always (0,), the masked loads and stores",
     "speed only: where D is whole steps of 16 the masks cover all 16 lanes, so every load and store "
     "moves the same values"),
    ("runner", "ModelRunner.__init__: `self._scratch = Scratch()` -> None",
     "memory only: the plain product of an int4 model widens W_hat into a new array each call instead "
     "of the runner's reused buffer; the same values"),
    ("generate", "Engine.load: `load_tokenizer(directory, runner.config)` -> `load_tokenizer(directory, None)`",
     "load_tokenizer reads the same directory's config.json when given none: the same tokenizer"),
    ("q8", "_check_q8_group: `group <= 0` -> `group <= 1`",
     "a group of 1 is refused by `group % 16` just after; the same refusals"),
    ("q8", "Q8Linear.quantize: `reshape(-1, ...)` -> `reshape(-2, ...)`",
     "numpy infers a dimension given any negative size: the same shape"),
    ("runner", "_check_tokens: text added around the hint of the text-tokens refusal (\"XX(encode ...)XX\")",
     "message only: the refusal still names the sequence, the text and the hint; the tests of a learner's "
     "runner check those words, not the whole sentence"),
    ("widgets.blockmap", "a colour or a CSS length in other letters (#ffffff -> #FFFFFF, 90px -> 90PX), the reset "
     "button's width left to the browser, a bar a pixel lower, a hash's label 12 pixels to the left or a table's "
     "line ending a third of a box along",
     "the same colours and lengths (both are case-blind), or a few pixels inside the drawing, whose box and "
     "columns are tested (`svg_outside`): presentation a test should not pin"),
    ("widgets.blockmap", "__init__: `self.step = 0` -> 1",
     "a story's map goes to step 0 (`goto`) before anything reads it; a map of a given pool has no story buttons"),
    ("widgets.int4", "__init__: `_quiet` left False while a given W and g are put in, `observe` of every trait, "
     "`view` first \"\" (then refresh sets it), the labels' width an invalid CSS length; _on_change: `str(g)` -> "
     "`str(None)`",
     "each only adds refreshes that end in the same view; a change event comes only when a value changed, so "
     "the typed values never equal the preset's there and the preset becomes \"typed\" either way; a CSS length "
     "the browser cannot read leaves its default label width (presentation)"),
    ("widgets.numbers", "__init__: `narrowings` first None (set by the first refresh); the placeholder in capitals",
     "refresh runs in __init__ before anything reads it; a placeholder's case is presentation"),
    ("widgets.checkpoint", "_bar: the tensors' colours taken in the other order (`n_tensor -= 1`), a label kept "
     "only where it is narrower than its segment (`<=` -> `<`); _hex_row: a byte's text a sixth of its cell from "
     "the cell's left instead of centred",
     "neighbouring tensors still differ in colour; a segment exactly as wide as a label's estimate, to the last bit "
     "of a float, is not one a file gives; the text stays inside its cell (tested): presentation a test should "
     "not pin"),
    ("widgets.checkpoint", "__init__: `file_layout` or `param_count` first \"\" instead of None",
     "refresh runs in __init__ before anything reads them, and sets both"),
    ("widgets.enginesteps", "timeline: a prefix-cache hit's bar or the selection's frame a pixel lower; __init__: "
     "the back button's width left to the browser, the next button's text in capitals, the slider's first value "
     "None",
     "a pixel inside the drawing (the frame still spans every row: tested), a width or a letter case: "
     "presentation; an IntSlider given None starts at its minimum, 0, as given"),
    ("widgets.exercise", "table_html: every state in black (`COLOURS.get(None, ...)`), an unknown state's colour "
     "None, a row's end tag in capitals (`</TR>`); __init__: the dropdown's label (`XXmodulesXX`), `observe` of "
     "every trait of the two controls",
     "the state is written in words beside its colour and every state has one; HTML's tags are case-blind; a "
     "label's text is presentation; a pick changes the value (the other traits that change with it only call "
     "_unchecked again, to the same view)"),
    ("widgets.pitfalls", "_f16_drift: the histogram's steps drawn at their bins' left (`where` left out); "
     "_lru_eviction: the block numbers' boxes square; __init__: the off button's width left to the browser; run: "
     "'the pitfall off' in capitals in the line shown while a test runs",
     "the same counts, block numbers and words in another shape or case: presentation a test should not pin"),
    ("widgets.pitfalls", "the probes' pictures: an axis's or a legend's words in capitals or between XX (`z_HF` -> "
     "`z_hf`), a colour's hex in capitals, the pitfall's errors joined by a line instead of dots, the bound's marks "
     "a point larger, a picture in words left with its axes' frame",
     "the same data, curves and words in another case or shape (what each picture plots, which part is the "
     "pitfall and what its axes measure are tested): presentation a test should not pin"),
    ("widgets.pitfalls", "verdict_html: the test's name `split(\"::\")[+1]` instead of `[-1]`",
     "every test of the registry is file::function, whose second part is its last"),
    ("widgets.sampler_charts", "_on_set: `argsort(kind=\"STABLE\")`; the empty kept set's dict keys "
     "(`XXvaluesXX`, `VALUES`)",
     "numpy reads the kind case-blind, and kept ids are distinct (stability cannot show); every stage keeps at "
     "least one id (the token), so the empty branch is not reached"),
    ("widgets.sampler_charts", "render_charts, stage_notes: a note's text in capitals or between XX, the "
     "'Showing n of V ids' note's closing tags in capitals",
     "message only: the words a note says, as the runner's refusal text above; HTML's tags are case-blind"),
    ("widgets.sampler_playground", "__init__: `shown_ids` first None; _build: the controls' box's flex-flow an "
     "unreadable CSS value, the preset's label (`XXlogits presetXX`), the output box's label width left to the "
     "browser, its placeholder in capitals",
     "update runs in __init__ (through the preset or set_logits) and sets shown_ids before anything reads it; the "
     "rest is presentation (a CSS value the browser cannot read leaves its default)"),
    ("widgets.sampler_playground", "set_logits: `self._quiet = False` while the boxes and the preset are set",
     "each box's change and the preset's (which calls set_logits again with the same values) only adds refreshes "
     "that end in the same view; speed only"),
    ("widgets.model_playground", "__init__: `observe` of every trait of the chat checkbox, the checkbox indented "
     "(`indent` True or left out)",
     "its value is the only trait of it that changes once built (the others would only restart to the same "
     "view); an indent is presentation"),
    ("widgets.model_playground", "_say: `escape` False by default; a status line's words in capitals or between XX "
     "(\"SHORTEN THE PROMPT.\", \"NOTHING APPENDED, ...\", \"XXgreedy, no drawXX\")",
     "every text _say is given unescaped is the widget's own words and numbers, with no character HTML reads "
     "(a refusal goes through `message`, which escapes); message only"),
    ("switch", "SourceFinder.find_spec: spec_from_file_location's location `origin` -> None, or left out",
     "without a location importlib asks the loader for it (get_filename), which is the same path"),
    ("paths", "open_regular: `getattr(os, \"O_NONBLOCK\", 0)`'s default 0 -> 1, None or none",
     "the default is read only where os has no O_NONBLOCK (Windows, where the commands do not run)"),
    ("paths", "read_regular: `f.read(size + 1)` -> `f.read(size + 2)` or `f.read(None)`",
     "the same bytes from a file that does not grow while it is read: all of them; the one byte past "
     "size only shows a file grown since its fstat, which no test can make happen between two lines"),
    ("machine", "read_gbps: the default of the largest cache 0 -> 1 byte, or rows of 4097 bytes' worth",
     "the same size to the MB (256 at least either way), and the bandwidth is the bytes read over the time"),
    ("machine", "read_gbps: `_READ.append(_read_kernel())` -> None",
     "the compiled read is built once a process, and mutmut's forked runs inherit the one built before "
     "the mutant is switched on (a fresh process would call None and fail)"),
    ("machine", "describe: the default of cpuinfo's flags when it has neither flags nor Features \"\" -> \"XXXX\"",
     "no feature is named XXXX: the isa list is empty either way (tested)"),
    ("machine", "fma_gflops: the default rounds 5 -> 6",
     "one more timed round of the same kernel: the best of six instead of five, a speed figure only"),
    ("tuning", "_blas_fn: `... if lib is not None else None` -> `... if (lib is not None) or True else None`",
     "getattr(None, name, None) is None too: the same answer"),
    ("tuning", "set_blas_threads: `fn.argtypes = [ctypes.c_int]` -> `None`",
     "without argtypes ctypes passes a Python int as a C int all the same: the same call"),
    ("widening", "Arena.__init__: the map's flags (private, anonymous) left to mmap's default (shared)",
     "the same zeroed memory either way; private is what lets the kernel back it with 2 MiB pages, a "
     "speed no test times (benchmarks/ measure it)"),
    ("checks", "rows_of: the fast path's `type(x) is np.ndarray` -> `type(None) is np.ndarray`",
     "speed only: the general path returns the same float32 array, uncopied (tested)"),
    ("sample_reference", "_ref_penalise: `if l[i] > 0` -> `>= 0`",
     "a logit of 0 (or -0.0) is 0 divided or multiplied by the penalty alike, and its sign is made + after"),
    ("sample_reference", "top_p: `if params.top_p != 1.0` -> `!= 2.0` (the walk run at p = 1)",
     "the walk at p = 1 stops early only where the running sum rounds up to 1, dropping ids whose mass "
     "is below that rounding, which no draw reaches (u < 1); the numpy sampler's trace is tested for it"),
    ("schema", "_describe: `missing.group(1) if missing else \"?\"` -> `if (missing) or True`",
     "jsonschema's 'required' message always begins with the property's name in quotes"),
    ("schema", "_describe: `schema.get(\"properties\", {})` -> `schema.get(\"properties\", )`",
     "config.schema.json always has properties: the same dict"),
    ("schema", "_import_validator: a blocked package set to \"\" instead of None in sys.modules",
     "the block is read only by jsonschema's first import, once a process; mutmut's runs fork from one "
     "that imported it already"),
    ("lazy_kernels", "exp_f64: `x.reshape(-1)` or `out.reshape(-1)` -> `reshape(-2)`",
     "numpy infers a dimension given as any negative number: the same flat view"),
    ("pipeline", "_stage: `llama_forward(..., product=runner.product, ...)` -> without the product",
     "a step runs pipelined only with the invariant product (`pipeline_parts`), which is llama_forward's "
     "default; the plain product is never pipelined (tested)"),
    ("pipeline", "pipelined: stage A's thread named None instead of \"tl_lab prefill stage A\"",
     "a thread's name, seen only in a debugger or a profiler"),
    ("pipeline", "Handoff._stop_if_failed: _Abandoned's message decorated",
     "never shown: a stage that stops with _Abandoned does so because the other raised, and that first, "
     "real error is the one raised to the caller (tested)"),
    ("pitfalls", "_probe_nucleus_edge: the trace's stream (0, 4) -> (0, 5)",
     "the probe reports the trace's kept set and cumulative sums, which no stream changes; the draws "
     "come from their own streams"),
    ("pitfalls", "_probe_zero_pool: the last return's error \"\" -> \"XXXX\"",
     "reached only by a pool that refuses neither its config nor its first alloc, which neither the "
     "correct code nor s19 is"),
    ("exercise.stubs", "reference_source: `read_text(encoding=\"utf-8\")` -> `encoding=None`",
     "the six reference modules are ASCII, which every encoding reads alike"),
    ("exercise.registry", "match: `func.split(\"[\", 1)[0]` -> `split(\"[\", 2)[0]` or `split(\"[\")[0]`",
     "the text before the first bracket, however many splits follow"),
    ("exercise.guard", "_kv, _quant, _sample, _runner: a trial's inputs changed (a token, a value of the f16 "
     "example, a row count, a dtype left to numpy, the rng None at temperature 0)",
     "a trial asks only that the learner's module runs on a small case without raising (TRIALS), never "
     "what it answers: the reference runs on the changed input as on the first, and the notebooks' own "
     "asserts are what judge an answer"),
    ("exercise.side", "_against_hf: the block size left to KvConfig's default (16, the one passed), or the "
     "cases left to against_hf's default (the same golden cases)",
     "the same runner and the same cases; the logits do not depend on the block size either (section 2.4)"),
    ("exercise.side", "yours: `read_text(encoding=\"utf-8\")` -> the locale's encoding",
     "the same text under a UTF-8 locale, as every machine here runs; the stubs are ASCII"),
    ("exercise.side", "yours_or_none: `where = \"\"` -> None",
     "read only when no frame of the learner's file is in the traceback and the error is no SyntaxError, "
     "and a module that ran (and so raised) ran its file's code: no input reaches it"),
    ("tokenizer", "_call_size: expandtabs's non-integer tab size counted as 0 -> 1 a tab",
     "str.expandtabs takes only an integer: the call the size is for raises TypeError whatever the count"),
    ("exercise.gradebook", "grade: the gradebook opened with the locale's encoding or without `newline=\"\"`",
     "the same bytes under a UTF-8 locale on Linux, as every machine here runs: `newline=\"\"` (the csv module's "
     "advice) matters only where Python writes \\r\\n for \\n"),
    ("exercise.gradebook", "grade: `check(ws, MODULES, ...)` -> `check(ws, None, ...)` or the modules left out",
     "check's default is all six, the same list"),
    ("exercise.cli", "_parity: the learner's line looked up without the default None",
     "the same case: the import ran the learner's file, so its frame is in the traceback"),
    ("quant", "_bits16: `h.dtype.kind not in \"iu\"` -> `not in \"XXiuXX\"`",
     "no numpy dtype's kind is X: the same test"),
    ("quant", "_int4_pair_table: a nibble's value one off",
     "the tables are built when the module is imported, before a forked run switches its mutant on (as the "
     "catalogue's rows); in a fresh process the int4 tests fail, and s09 edits the same line"),
    ("kernels (hand-written)", "attention: the next block's keys not prefetched",
     "speed only: a prefetch is a hint; the same bits (kept in the list as the harness's own check)"),
    ("exercise.plugin", "_write: the report opened with `encoding=\"UTF-8\"` or the locale's encoding, or dumped "
     "with `indent=2`",
     "json.dump escapes every non-ASCII character (ensure_ascii), so every locale writes the same bytes, and a "
     "codec's name is case-blind; the indent is whitespace the report's reader skips"),
    ("exercise.plugin", "pytest_runtest_logreport: `getattr(report, \"learner_at\", \"\")` -> default None",
     "both defaults are false: no \"at\" either way"),
    ("schema", "_values_in: the stack extended while `n < budget` instead of `n <= budget`",
     "at n == budget the field already counts 1 + budget values, past the limit: refused either way, naming "
     "the same field (a seeded walk of random configs at limits 1 to 29 found no difference)"),
    ("checks", "rows_of: `x.dtype.kind not in \"fiu\"` -> `not in \"XXfiuXX\"`",
     "a dtype's kind is one letter, and no kind is X: the same test"),
    ("widgets.common", "_forget_outputs: `getattr(ip, \"user_ns_hidden\", {})` without its default; _parts: "
     "`getattr(w, \"_trait_values\", {})` -> default None; _running_cell: `parent.get(\"content\", {})` without "
     "its default",
     "every IPython shell has user_ns_hidden, every widget (a HasTraits) _trait_values, and an execute_request "
     "always carries its content (the code): no default is read"),
    ("widgets.common", "hbars_svg: the chart 99 pixels wide instead of 98; _hbar_row: a value's text a pixel "
     "lower; labels_svg: the picture a pixel taller, a label's colour an unreadable `XX#222XX`",
     "a pixel inside the drawing (the pictures' boxes are tested, `svg_outside`), or a colour the browser cannot "
     "read, leaving SVG's default black for #222: presentation a test should not pin"),
    ("widgets.int4", "int4_view: `s_each.astype(np.float64)` -> `astype(None)`",
     "numpy reads a dtype of None as float64: the same halves"),
    ("widgets.int4", "error_svg: a column's number a third of its bar from the left instead of centred, the "
     "chart at least 301 pixels wide instead of 300, `XXXX` between its shapes, its end tag `</SVG>`; __init__: "
     "the group box's width left to the browser, its label width `110PX`",
     "a pixel or a few inside the drawing, character data between shapes (SVG draws text only inside <text>), "
     "tags and CSS lengths (case-blind), a box's width: presentation a test should not pin"),
    ("widgets.sampler_playground", "_build: the controls' box's flex-flow None, the prompt box or the draws box "
     "without field_style (the browser's widths), the draws box's widths in capitals (`200PX`, `90PX`), the "
     "output box's label in capitals",
     "presentation: the same boxes with the same values (tested), in another width, wrapping or letter case; "
     "CSS lengths are case-blind"),
    ("widgets.sampler_playground", "update: `stage_data(self.trace, self.shown_ids, params)` -> params None",
     "stage_data reads only the trace and the ids: its params argument is not used"),
    ("model", "_check_parse_cost: the pieces read without their byte of overlap, the characters subtracted or "
     "counted with the continuation bytes, its refusal's message None",
     "left: killed by tests/test_hardening.py (the parse cost's exact bound for each character width, the "
     "pass with overlap 1, the refusal's words), outside model's fast selection"),
]
METHOD = (
    "mutmut 3.8.1 per module, each in a scratch copy (git archive) with only that module mutated "
    "(only_mutate) and its own test file(s) (MODULES), one worker (--max-children 1), a seeded sample "
    "of 40 mutants per module (seed 20), a wall-time budget per module (600 s before, 900 s after: the "
    "machine is 2 cores shared by five). score = killed / (killed + survived); mutants not run in the "
    "budget, reached by no test, or ended by a signal mutmut does not map (SIGTERM) count in neither. "
    "'before' is main at f1510b4 (the tests as they were), 'after' this branch's HEAD with the new tests; "
    "the mutants differ where the code changed, so each is its own sample. The kernels: the hand-written "
    "KERNEL_MUTANTS, each a text edit in a fresh copy with its own numba cache, run against "
    "tests/test_kernels.py and tests/test_lanes.py. Widened (session 2 of issue 20): 'wide-before' is "
    "a larger seeded sample (fetch 120, blocks all 105, runner 60, generate 60, model 80) at a976f14 or "
    "e2b4c68, before that session's new tests; 'wide-after' runs only that sample's survivors again "
    "at the commit with the new tests (--survivors-of: the module's code is the same, so a mutant the old "
    "tests killed stays killed); 'after-rerun' does the same for the 40-mutant 'after' sample "
    "(tokenizer). sample changed since its 'after' run, so 'after-2' is a new 40 at 35a1786 and "
    "'after-2-rerun' its survivors at 076c00c. Mutants mutmut ended with SIGTERM (its timeout, on a host "
    "at load 5 to 9) count in neither. Those SIGTERMs were mostly not the load: GNU OpenMP is not "
    "fork-safe, and a mutant's run forked by mutmut waited forever at its first parallel kernel (FORK_SAFE "
    "says what the runs set since). With it, on processor E: 'forward' added to the modules (its own and "
    "the runner's tests), 's43-forward' a seeded 40 (seed 20) at 1d36fac and 's43-forward-rerun' its "
    "survivors at 132e6bb with new tests; 's43-fork-safe' runner and generate, a new 60 each (seed 21) "
    "at 132e6bb, and 's43-fork-safe-rerun' their survivors with new tests (generate at 4fadeb0, runner at "
    "57adb19); quant the same, its 60 at 4ec9f4c (2 reached by no test), its survivors again at "
    "57adb19. 's43-new-modules': products, q8 and compare mutated for the first time, 40 each (seed 21) "
    "at 785151d (products 6 and compare 17 reached by no test), their survivors again at 4985be9 "
    "('s43-new-modules-rerun') and q8's once more at the next commit ('s43-new-modules-rerun2'); "
    "machine and tuning the same at ecd2783, machine's parsing then given a function of its own, so a "
    "new 40 at 43d4d80 ('s43-new-modules-after') and its survivors again, tuning's survivors again "
    "('s43-new-modules-rerun'), then a new 40 at 179ad9c with the tests reaching all of it "
    "('s43-new-modules-after') and its survivors again. 's44-new-modules': pipeline (its mutants on "
    "numba's TBB layer, FORK_SAFE), fp8, widening and checks mutated for the first time, 40 each "
    "(seed 22) at ca1ef5b; 's44-new-modules-rerun' their survivors at 073546c with new tests. "
    "'s44-more-modules': sample_reference, schema and lazy_kernels, 40 each (lazy_kernels: 25 of its 39 "
    "reached by no test), at 9fc90a6 and e06ca38 (a page of docs apart); 's44-more-modules-rerun' their "
    "survivors with new tests; 's44-lazy-all' all 39 of lazy_kernels' mutants at ac367bb, and "
    "'s44-lazy-all-rerun' its survivors with one more test. 's46-*': machine and widening again after "
    "the count of cores moved, and paths, errors, switch and four widgets for the first time, each "
    "'-rerun' (or '-after', a new sample where the code changed) with the new tests. 's47-pitfalls': "
    "pitfalls.py, 40 (seed 20) at 07e7ceb, 20 of them reached by no test (the lab's probes ran only in "
    "subprocesses); 's47-pitfalls-after' the same 40 at 9789751 with tests that run each probe in "
    "process, and 's47-pitfalls-after-rerun' its survivors at 2201f8d. "
    "'s47-widgets': the seven widgets not mutated before (checkpoint, enginesteps, exercise, the pitfall lab "
    "widgets.pitfalls, and the sampler's charts, playground and model playground), 40 each (seed 20) at "
    "b6363a7, the sampler's three at d5713a0: their first run stopped at mutmut's first pass of the tests, "
    "where workqueue aborted the model playground's pipelined prefill at two kernel threads, so they run at "
    "one (FORK_SAFE); 's47-widgets-rerun' their survivors at 16ca1a7 with new tests, and sampler_charts' once "
    "more at c9cdb43 ('s47-widgets-rerun2'). 24 of widgets.pitfalls' 40 were reached by no test (its probes' "
    "pictures), so 's47-widgets-after' runs the same 40 whole at 16ca1a7, with a test that draws every "
    "picture, and 's47-widgets-after-rerun' its survivors at c9cdb43. From s47-widgets on, `machines` keeps "
    "the machine of each label. 's47-exercise': the exercise's stubs, catalogue and workspace, 40 (seed 20) "
    "at aaa2678 with the exercise tests started from the clone (_EXERCISE_IN_PROCESS; mutmut's trampolines "
    "fail in a process started from another folder), and 's47-exercise-rerun' their survivors at 3efbed0 "
    "with new tests. "
    "The catalogue's and the pieces' rows (registry._g, _pieces) are built when the module is imported, "
    "before a forked run switches its mutant on, so mutmut cannot reach them: their 17 survivors are killed "
    "in a fresh process (a Piece of three fields fails collection, a kind of None the tests command's test). "
    "'s48-whole': five samples whose reruns of the survivors had left out the mutants no test reached "
    "(exercise.workspace, widgets.common, compare, products, widgets.model_playground), 40 each (seed 20: the "
    "same 40 for the workspace and the model playground, a new 40 for the other three) run whole at b0ef9dd (the catalogue's run there stopped at mutmut's first pass of the tests: a new test "
    "read README.md, which mutmut's tree lacked until also_copy named it). 's48-after': the same samples of "
    "the workspace at 543cd9d, and of the catalogue, widgets.common (its selection now with the sampler "
    "widgets' tests, the users of its charts) and products at d6f46d4, compare's at 0a2d14e, with tests "
    "reaching what no test had; 's48-after-rerun' the survivors of widgets.common and the workspace again with new tests. "
    "'s48-exercise': the exercise's cli, grading, guard and parity mutated for the first time, 40 each (seed "
    "20) at b8447c7, side at 52e3352 and plugin at fc386f8 (no test in process had reached parity, grading, "
    "guard or the plugin's hooks); "
    "'s48-exercise-after' the same 40 of the first four with tests that run them in this process (a report "
    "read into a row, the guard's trial process, the command line's parser), and 's48-exercise-after2' all "
    "six whole again with the tests written for their survivors (side at d4f469e, after its mend). "
    "'s48-whole2': the samples whose last run had still left mutants untried, run whole with their first "
    "seeds (quant 60 seed 21, pitfalls 40 seed 20, widgets.sampler_playground 40 seed 20, widgets.int4 40 "
    "seed 46, machine 30 seed 46) at 01ea5ac or the next commit; 's48-whole2-after' the first four again "
    "with the tests written for what they found, and widgets.model_playground's 40 (seed 20) whole; "
    "'s48-whole2-after-rerun' the survivors of quant, the int4 widget and the two playgrounds again. "
    "'s53-review': the ten modules the day's change of 2026-12-06 touched (exercise.plugin, exercise.parity, "
    "exercise.grading, schema, checks, widgets.common, widgets.int4, widgets.sampler_playground, model, "
    "tokenizer), 40 each (seed 20) at 4bda722; 's53-review-after' their survivors again with the tests "
    "written for them."
)


def _sh(cmd: list[str], cwd: Path, timeout: float | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, text=True, capture_output=True, timeout=timeout, **kw)


def _checkout(ref: str, where: Path) -> None:
    """A clean copy of the tracked tree at `ref` (no .git, no caches)."""
    if where.exists():
        shutil.rmtree(where)
    where.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", ref], cwd=REPO, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x"], cwd=where, input=archive, check=True)


def _source(module: str) -> str:
    """The file of a module name as MODULES gives it: "kv" -> tl_lab/kv.py, "blocks" -> tl_lab/engine/blocks.py,
    "widgets.int4" -> tl_lab/lab/widgets/int4.py (the layer from tl_lab's table of moved names), "ops.fast_sample"
    -> tl_lab/ops/fast_sample.py."""
    import tl_lab

    layer = tl_lab._MOVED.get(module.split(".")[0])
    return f"tl_lab/{layer + '/' if layer else ''}{module.replace('.', '/')}.py"


def _setup_cfg(module: str, selection: list[str]) -> str:
    tests = "\n".join(f"    {a}" for a in selection)
    # conftest.py: the clone's root one, which sets TL_LAB_WORKSPACE=off for every run in the clone
    return (f"[mutmut]\nsource_paths = tl_lab\nonly_mutate = {_source(module)}\nalso_copy =\n    data\n    docs\n    notebooks\n    README.md\n    .gitignore\n    conftest.py\n"
            f"pytest_add_cli_args_test_selection =\n{tests}\n"
            "pytest_add_cli_args =\n    -p\n    no:cacheprovider\n    -q\n    -x\n")


def _meta(work: Path, module: str) -> dict[str, int | None]:
    """mutant name -> mutmut's exit code for it (None: not run yet)."""
    path = work / "mutants" / f"{_source(module)}.meta"
    return json.loads(path.read_text())["exit_code_by_key"] if path.exists() else {}


def run_module(module: str, ref: str, sample: int | None, seed: int, budget: float,
               only: list[str] | None = None) -> dict:
    """Mutate the module's file (`_source`) at `ref`: its score over all or a seeded sample of its mutants
    (`only`: run just these of them, the rest of the sample stays not run)."""
    work = _work(ref, module)
    _checkout(ref, work)
    (work / "setup.cfg").write_text(_setup_cfg(module, MODULES[module]))
    t0, timed_out, env = time.time(), False, _mutmut_env(module)
    try:
        # A filter matching nothing: mutmut generates the mutants, maps tests to functions, then stops.
        _sh([*MUTMUT, "run", "--max-children", "1", "no-such-mutant"], work, timeout=budget, env=env)
        chosen = _chosen(work, module, sample, seed)
        if only is not None:
            chosen = [n for n in chosen if n in only]
        if chosen:
            run = _sh([*MUTMUT, "run", "--max-children", "1", *chosen], work,
                      timeout=max(60.0, budget - (time.time() - t0)), env=env)
    except subprocess.TimeoutExpired:
        timed_out = True
    r = {**score_module(module, ref, sample, seed), "seconds": round(time.time() - t0, 1), "budget_hit": timed_out}
    if not r["tried"] and not timed_out and chosen:  # mutmut stopped before any mutant: say why
        r["mutmut_said"] = (run.stdout + run.stderr)[-2000:]
    return r


def rerun_survivors(module: str, ref: str, sample: int | None, seed: int, budget: float, earlier: dict) -> dict:
    """The score at `ref` of an earlier run's sample when only tests were added since: its survivors
    run again (a mutant the old tests killed, they still kill: the code and those tests are the same),
    the rest of the sample counted as the earlier run found it."""
    r = run_module(module, ref, sample, seed, budget, only=list(earlier["survivors"]))
    if "mutmut_said" in r:  # mutmut stopped before any mutant: there is no score to give
        raise SystemExit(f"{module}: mutmut ran no mutant at {ref}:\n{r['mutmut_said']}")
    if r["mutants_in_module"] != earlier["mutants_in_module"]:
        raise SystemExit(f"{module}: {r['mutants_in_module']} mutants at {ref}, {earlier['mutants_in_module']} "
                         "before: the module changed, so its survivors are not the same mutants; run it whole")
    killed = earlier["killed"] + r["killed"]
    tried = earlier["killed"] + r["killed"] + r["survived"]
    return {**r, "killed": killed, "tried": tried, "score": round(killed / tried, 3) if tried else None,
            "not_run": r["not_run"] - earlier["killed"],  # those were run, in the earlier run
            "rerun": f"the {len(earlier['survivors'])} survivors of the earlier run of this sample, again; "
                     f"its {earlier['killed']} killed counted as killed"}


MUTMUT = [sys.executable, "-m", "mutmut"]
TBB_LIB = Path(sys.prefix) / "lib"
_ONE_KERNEL_THREAD = {"NUMBA_THREADING_LAYER": "workqueue", "NUMBA_NUM_THREADS": "1"}
FORK_SAFE = {"generate": _ONE_KERNEL_THREAD, "pipeline": {"NUMBA_THREADING_LAYER": "tbb"},
             **{f"widgets.{m}": _ONE_KERNEL_THREAD
                for m in ("common", "sampler_charts", "sampler_playground", "model_playground")}}
"""What each module's mutmut run sets for numba. mutmut forks each mutant's run from a process that has
already run the tests, and GNU OpenMP (numba's threading layer here) is not fork-safe: a child's first
parallel kernel waited forever, until mutmut's timeout ended it with SIGTERM (in the 'forward' module's
first sample, 24 of 40 mutants, every one whose run reached a parallel kernel). So the runs use numba's
own workqueue layer; where a module's tests launch kernels from two Python threads at once, which
workqueue refuses at two kernel threads (it aborts), with one kernel thread ('generate', whose tests need
no second one; GNU OpenMP at one thread still hung there, in a test that streams from a Python thread;
and the sampler widgets' (and the helpers they share), whose model playground prefills a 512-token prompt pipelined, in two stages).
'pipeline' needs both, two kernel threads launched from two Python threads (its two stages): there TBB,
numba's one layer both fork-safe and safe from several Python threads (`pip install 'tbb<2023'`, whose
libraries land in the environment's lib/, off the loader's path, hence LD_LIBRARY_PATH, which
`_mutmut_env` puts first on the path of the run's own environment)."""


def _mutmut_env(module: str) -> dict[str, str]:
    """The environment of a module's mutmut run: this process's, with FORK_SAFE's settings for numba."""
    env = dict(FORK_SAFE.get(module, {"NUMBA_THREADING_LAYER": "workqueue"}))
    if env["NUMBA_THREADING_LAYER"] == "tbb":
        if not any(TBB_LIB.glob("libtbb.so.12*")):
            raise SystemExit(f"{module}: its mutants run on numba's TBB layer (FORK_SAFE): pip install 'tbb<2023'")
        # read at the run, not at import: the path the run is started with, whatever it was then
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, (str(TBB_LIB), os.environ.get("LD_LIBRARY_PATH"))))
    return dict(os.environ, **env)


def _work(ref: str, module: str) -> Path:
    return SCRATCH / ref.replace("/", "_") / module


def _chosen(work: Path, module: str, sample: int | None, seed: int) -> list[str]:
    """The mutants run: all of the module's, or a sample drawn with `seed` (the same names again on a rescore)."""
    names = sorted(_meta(work, module))
    return names if sample is None or sample >= len(names) else sorted(random.Random(seed).sample(names, sample))


def score_module(module: str, ref: str, sample: int | None, seed: int) -> dict:
    """The score of a module's run, read from mutmut's results in its scratch copy."""
    work = _work(ref, module)
    codes, chosen = _meta(work, module), _chosen(work, module, sample, seed)
    status = {n: _status(codes.get(n)) for n in chosen}
    count = {s: sum(v == s for v in status.values()) for s in ("killed", "survived", "not run", "no tests", "other")}
    survived = [n for n, v in status.items() if v == "survived"]
    tried = count["killed"] + count["survived"]
    return {
        "mutants_in_module": len(codes),
        "sampled": None if sample is None or sample >= len(codes) else {"n": len(chosen), "seed": seed},
        "tried": tried, "killed": count["killed"], "survived": count["survived"], "not_run": count["not run"],
        "no_tests": count["no tests"], "other": count["other"],
        "score": round(count["killed"] / tried, 3) if tried else None,
        "tests": MODULES[module],
        "survivors": {n: _sh([*MUTMUT, "show", n], work).stdout[-1500:] for n in survived},
    }


# mutmut's exit codes (mutmut/stats.py): a failing test, an internal pytest error, a timeout or a crash
# kill the mutant; 0 survives; 5 and 33 mean no test reached it; None or 2 not run (the budget ended);
# the rest (skipped, suspicious) count in neither.
_KILLED = {1, 3, 36, -24, 24, 152, 255, -11, -9}


def _status(code: int | None) -> str:
    if code is None or code == 2:
        return "not run"
    if code == 0:
        return "survived"
    if code in (5, 33):
        return "no tests"
    return "killed" if code in _KILLED else "other"


def run_kernels(ref: str, budget: float, only: list[str] | None = None, out: dict | None = None) -> dict:
    """The hand-written kernel mutants: each a text edit in a fresh copy, tests must fail. `only`:
    run just the mutants whose names hold one of these words; `out`: earlier results to add to."""
    work = SCRATCH / ref.replace("/", "_") / "kernels"
    tests = ["tests/test_kernels.py", "tests/test_lanes.py", "-q", "-x", "-p", "no:cacheprovider"]
    out, t0 = dict(out or {}), time.time()
    for name, file, old, new in KERNEL_MUTANTS:
        if only and not any(w in name for w in only):
            continue
        _checkout(ref, work)
        src = (work / file).read_text()
        if old not in src:
            out[name] = {"status": "not applicable (text not found)", "edit": [file, old, new]}
            continue
        (work / file).write_text(src.replace(old, new, 1))
        env = dict(os.environ, PYTHONPATH=str(work), NUMBA_CACHE_DIR=str(work / ".numba"))
        try:
            p = _sh([sys.executable, "-m", "pytest", *tests], work, timeout=max(60.0, budget - (time.time() - t0)), env=env)
            status = "killed" if p.returncode == 1 else ("survived" if p.returncode == 0 else f"error {p.returncode}")
        except subprocess.TimeoutExpired:
            status = "not run (budget)"
        out[name] = {"status": status, "edit": [file, old, new]}
    killed = sum(v["status"] == "killed" for v in out.values())
    tried = sum(v["status"] in ("killed", "survived") for v in out.values())
    return {"mutants": out, "tried": tried, "killed": killed, "survived": tried - killed,
            "score": round(killed / tried, 3) if tried else None, "seconds": round(time.time() - t0, 1)}


def summary(results: dict) -> dict:
    """module -> {label: score, label_killed_of_tried: "k/t"} over every label's run of it."""
    out: dict = {}
    for label, modules in sorted(results.items()):
        for module, r in modules.items():
            out.setdefault(module, {})[label] = r.get("score")
            out[module][f"{label}_killed_of_tried"] = f"{r.get('killed')}/{r.get('tried')}"
    return out


def _machine() -> dict:
    import platform

    mutmut = _sh([sys.executable, "-m", "pip", "show", "mutmut"], REPO).stdout.split("\n")
    cpu = next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                if l.startswith("model name")), platform.machine()) if Path("/proc/cpuinfo").exists() else platform.machine()
    try:
        from llvmlite import binding

        llvm_cpu = binding.get_host_cpu_name()
    except ImportError:
        llvm_cpu = None
    return {"processor": cpu, "numba_cpu": llvm_cpu, "cores": os.cpu_count(),
            "python": platform.python_version(),
            "mutmut": next((l.split()[-1] for l in mutmut if l.startswith("Version")), None)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("modules", nargs="*", help=f"modules to mutate, of {', '.join(MODULES)}, or all of them: all "
                                                 "(default: none)")
    p.add_argument("--label", required=True, help="where the scores go in the results, e.g. before / after")
    p.add_argument("--ref", default="HEAD", help="the git commit to mutate (default HEAD)")
    p.add_argument("--sample", type=int, help="run a seeded random sample of this many mutants per module")
    p.add_argument("--seed", type=int, default=20)
    p.add_argument("--budget", type=float, default=900.0, help="seconds per module at most")
    p.add_argument("--kernels", action="store_true", help="also the hand-written kernel mutants")
    p.add_argument("--only-kernel", nargs="*", metavar="WORD", help="only the kernel mutants whose names hold a WORD")
    p.add_argument("--rescore", action="store_true", help="score the modules' last runs again, running nothing")
    p.add_argument("--survivors-of", metavar="LABEL", help="run only the survivors of LABEL's run of the same "
                   "sample (after adding tests: the rest stay killed)")
    p.add_argument("--out", type=Path, default=RESULTS, help=f"the results file (default {RESULTS.relative_to(REPO)})")
    args = p.parse_args(argv)
    if args.modules == ["all"]:
        args.modules = list(MODULES)
    unknown = [m for m in args.modules if m not in MODULES]
    if unknown:
        p.error(f"no test selection for {unknown}; known: {', '.join(MODULES)}")
    doc = json.loads(args.out.read_text()) if args.out.exists() else {"results": {}}
    doc["machine"] = _machine()  # the last run's; `machines` keeps each label's (a rescore runs nothing)
    if not args.rescore and (args.modules or args.kernels):
        doc.setdefault("machines", {})[args.label] = doc["machine"]
    doc.update(method=METHOD, equivalent=[dict(zip(("module", "change", "why"), e)) for e in EQUIVALENT])
    bucket = doc["results"].setdefault(args.label, {})
    for module in args.modules:
        commit = _sh(["git", "rev-parse", args.ref], REPO).stdout.strip()  # per module: HEAD may move meanwhile
        if args.rescore:
            r = {**bucket.get(module, {}), **score_module(module, args.ref, args.sample, args.seed)}
        elif args.survivors_of:
            r = rerun_survivors(module, args.ref, args.sample, args.seed, args.budget,
                                doc["results"][args.survivors_of][module])
        else:
            r = run_module(module, args.ref, args.sample, args.seed, args.budget)
        bucket[module] = {"commit": commit, **r}
        print(f"{args.label} {module}: {r['killed']}/{r['tried']} killed (score {r['score']}), "
              f"{r['mutants_in_module']} mutants in the module, {r['seconds']} s", flush=True)
        doc["summary"] = summary(doc["results"])
        args.out.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    if args.kernels:
        commit = _sh(["git", "rev-parse", args.ref], REPO).stdout.strip()
        earlier = bucket.get("kernels (hand-written)", {}).get("mutants")
        r = run_kernels(args.ref, args.budget, args.only_kernel, earlier)
        bucket["kernels (hand-written)"] = {"commit": commit, **r}
        print(f"{args.label} kernels: {r['killed']}/{r['tried']} killed, {r['seconds']} s", flush=True)
        args.out.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
