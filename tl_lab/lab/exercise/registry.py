"""What the learner writes: the pieces of each module, the chapter's test catalogue, the order.

Chapter L10.1, "How to work this chapter" and section 4. One source for the stubs (`tl_lab.lab.exercise.stubs`
blanks exactly the bodies named here in the reference's own source), for `exercise check` (which
tests grade which module) and for `exercise hint`. A name here that the reference no longer has
fails `tests/test_exercises.py`, so the registry cannot drift from the code.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MODULES", "DEPS", "HARNESS", "Piece", "PIECES", "Graded", "CATALOGUE", "SECTIONS", "pieces", "graded",
           "graded_for", "match"]

MODULES = ("kv", "quant", "model", "forward", "runner", "sample")
"""The six modules a learner writes: kv.py, quant.py, model.py, forward.py, runner.py and sample.py in the
workspace (the chapter names them kv.rs ... sample.rs, for its Rust engine)."""

DEPS: dict[str, tuple[str, ...]] = {
    "kv": (),
    "quant": (),
    "sample": (),
    "model": ("quant",),
    "forward": ("quant", "kv", "model"),
    "runner": ("quant", "kv", "model", "forward"),
}
"""The learner modules each one's graded tests run: a module is checked after these pass (or, with
--ref-deps, with the reference standing in for the ones that do not)."""

HARNESS: dict[str, tuple[str, ...]] = {"forward": ("runner",)}
"""Learner modules a module's tests drive it through without grading them: the forward's tests run
the layer through ModelRunner, which is the reference's until the learner's runner passes."""

SECTIONS = {
    "kv": "section 2.2 (the pool's own state) and section 4 (kv.py); docs/formats/kv-block.md",
    "quant": "sections 2.5 (int4) and 3 (the worked f16 and int4 examples), section 4 (quant.py)",
    "model": "section 2.3 (the model directory) and section 4 (model.py); docs/formats/safetensors.md",
    "forward": "section 2.4 (the Llama forward, one step) and section 4 (forward.py)",
    "runner": "sections 2.1 (three layers) and 2.4, section 4 (runner.py)",
    "sample": "section 2.6 (the sampler and PCG32), section 3 and section 4 (sample.py); docs/spec/pcg32.md, docs/spec/sampling.md",
}
"""Where to read for each module: the chapter's sections (written for its Rust engine: its kv.rs is your
kv.py, its "Rust-owned state" the pool's own state) and the specs in docs/."""


@dataclass(frozen=True)
class Piece:
    """One function or method the learner writes: `qualname` ("f" or "Class.method") in `module`,
    the chapter `section` to read, and a `hint` in the chapter's words."""

    module: str
    qualname: str
    section: str
    hint: str
    formula: str = ""
    """The hint's formula as a Python expression over the reference module's names (and the variables
    its hint names), word for word in the hint: tests/test_exercise_hints.py evaluates it against the
    reference on a few values, so a hint cannot state another formula than the code and the spec."""


def _pieces(module: str, rows) -> tuple[Piece, ...]:
    out = []
    for q, s, h, *f in rows:
        formula = f[0] if f else ""
        out.append(Piece(module, q, s, h.replace("{formula}", f"`{formula}`"), formula))
    return tuple(out)


PIECES: dict[str, tuple[Piece, ...]] = {
    "kv": _pieces("kv", [
        ("prefix_hash", "2.2", "blake2b, 8-byte digest: b'\\x00' (no parent) or b'\\x01' + parent as u64 LE, then the count as u32 LE and each id as u32 LE; the digest read as a u64 LE"),
        ("prefix_hashes", "2.2", "the chained hash of every FULL block: each block's parent is the block before it"),
        ("key_location", "3", "position j -> (j // B, table[j // B], j % B): table [7, 2, 9], B = 16, position 37 -> (2, 9, 5)"),
        ("KvCfg.validate", "2.2", "every size a positive int, dtype f16 and format 1; zero blocks is refused here, not at the first alloc (s19)"),
        ("KvPool.__init__", "2.2", "one buffer (n_blocks, n_layers, 2, H_kv, B, D) uint16 and the bookkeeping: refs, fills, hashes, the free list, the LRU, the hash index"),
        ("KvPool.slab", "2.2", "a view of data[id, layer, is_v], never a copy; refuse an id, layer or is_v out of range"),
        ("KvPool.ref", "2.2", "the block's reference count"),
        ("KvPool.fill", "2.2", "how many of the block's B slots hold keys"),
        ("KvPool.hash_of", "2.2", "the hash a registered block holds, else None"),
        ("KvPool.state", "2.2", "IN_USE (ref > 0), CACHED (ref 0, in the LRU) or FREE"),
        ("KvPool.lru", "2.2", "cached blocks, least recently released first: the next to evict"),
        ("KvPool.free_list", "2.2", "free blocks in the order alloc hands them out"),
        ("KvPool.available", "2.2", "free plus cached: what alloc can hand out"),
        ("KvPool.stats", "2.2", "the counts the block map shows: free, in_use, cached, registered, evictions, lookups, hits"),
        ("KvPool._check_id", "2.2", "a block id is an int in 0 .. n_blocks - 1, else KvError"),
        ("KvPool._check_in_use", "2.2", "the transitions act on in-use blocks only; a cached one is reacquired with lookup"),
        ("KvPool.alloc", "2.2", "all or nothing: free blocks first, then evict the OLDEST cached prefix (s18)"),
        ("KvPool.retain", "2.2", "one more reference to an in-use block"),
        ("KvPool.release", "2.2", "at ref 0 a registered block is cached (newest in the LRU), any other is freed"),
        ("KvPool.set_fill", "2.2", "0 <= n <= B, in-use blocks only; a registered block stays full"),
        ("KvPool.register", "2.2", "only full in-use blocks enter the hash index; another block holding h is a False, not an error"),
        ("KvPool.lookup", "2.2", "a hit reacquires the block: out of the LRU with ref 1, or ref + 1"),
        ("KvPool.export", "2.2", "the transfer envelope of docs/formats/kv-block.md: header, then each block's f16 slabs"),
        ("KvPool.import_", "2.2", "parse the whole envelope before allocating anything; a bad one allocates nothing"),
        ("KvPool._parse", "2.2", "check magic, version, the shape against this pool and the length, then the blocks"),
    ]),
    "quant": _pieces("quant", [
        ("round_half_even", "3", "keep the high bits; round up when the dropped part is above half, or exactly half and the kept part is odd"),
        ("explain_f32_to_f16", "3", "rebias the exponent, round the significand to nearest even; overflow to inf, subnormals, NaN stays NaN. Truncating is s08"),
        ("explain_f32_to_bf16", "3", "the top 16 bits of the f32, rounded to nearest even"),
        ("f32_to_f16_scalar", "3", "the bits of explain_f32_to_f16"),
        ("f32_to_bf16_scalar", "3", "the bits of explain_f32_to_bf16"),
        ("f16_to_f32_scalar", "2.5", "sign, 5 exponent bits biased by 15, 10 significand bits; exponent 0 is subnormal, 31 is inf or NaN"),
        ("bf16_to_f32_scalar", "2.5", "the f32 whose bits are {formula}", "h << 16"),
        ("f16_to_f32", "2.5", "scalars through the scalar path; arrays to float32 of the same shape (into out when given)"),
        ("bf16_to_f32", "2.5", "scalars through the scalar path; arrays: h << 16 as the f32's bits"),
        ("f32_to_f16", "3", "round to nearest even (numpy's float16 cast does), NaN quiet like the scalar path"),
        ("f32_to_bf16", "3", "of the f32 bits u: {formula} (0x7FFF plus the lowest kept bit, keep the top half); NaN quiet; a 0-d array in, a 0-d array out", "(u + 0x7FFF + ((u >> 16) & 1)) >> 16"),
        ("pack_int4", "2.5", "column 2b in the LOW nibble, 2b + 1 in the high one, 4-bit two's complement (the odd column low is s09)"),
        ("_int4_pair_table", "2.5", "byte -> (its low nibble's value, its high nibble's value), each 4-bit two's complement: (n ^ 8) - 8 (s09 swaps them)"),
        ("unpack_int4", "2.5", "the inverse of pack_int4: low nibble the even column; a nibble v sign-extends as {formula}; packed may be bytes (a graded test passes them) or a uint8 array", "(v ^ 8) - 8"),
        ("_group_scales", "2.5", "per group s = {formula}, the division in float32; a scale past f16's range is refused",
         "f32_to_f16(np.abs(Wg).max(axis=2) / np.float32(7))"),
        ("QLinear.quantize", "2.5", "round w / s with the f16 scale actually STORED, not the f32 one (s10); an all-zero group is s = 0, q = 0"),
        ("QLinear.dequantize", "2.5", "W_hat = q s, exact in float32"),
        ("QLinear.forward", "2.5", "y = x W_hat^T through the given `product_q4(x, planar, scales, f16_table)` (imported from tl_lab.ops.lazy_kernels): x float32 (m, inp) via `rows_of(x, inp)`, the nibbles where they are (self.planar), the f16 scale bits (self.scales) and `_F16_TABLE`, the f32 value of every f16 pattern"),
    ]),
    "model": _pieces("model", [
        ("ModelConfig.__post_init__", "2.3", "the field types, then the Llama's cross-field rules"),
        ("ModelConfig._check_types", "2.3", "each field's type and range, named in the error"),
        ("ModelConfig._check_llama", "2.3", "heads divide the hidden size, KV heads divide the heads, head_dim even: what a schema cannot say"),
        ("ModelConfig.from_json", "2.3", "parse (no duplicate keys, no NaN), the schema (tl_lab.ops.schema.validate_config), then the fields; refuse scaled RoPE, a sliding window, an unknown arch or tokenizer"),
        ("ModelConfig.load", "2.3", "config.json of the directory, bounded in size"),
        ("ModelConfig._from_checked_dict", "2.3", "Hugging Face's names to the config's fields, defaults where HF has them"),
        ("_rope_theta", "2.3", "rope_theta from the top level or rope_parameters; both present must agree"),
        ("parse_layout", "2.3", "8-byte little-endian header length, the JSON header, then the entries: offsets count from the DATA BUFFER (s11), they tile it, no gaps, no trailing bytes"),
        ("_check_entry_count", "2.3", "count the entries before parsing a huge header"),
        ("_parse_header_json", "2.3", "UTF-8 JSON object, no duplicate keys, no NaN, nothing after it"),
        ("_check_entries", "2.3", "every entry checked, then the tiling"),
        ("_check_entry", "2.3", "dtype known, shape a list of non-negative ints, offsets [begin, end) with end - begin = numel * itemsize"),
        ("_check_tiling", "2.3", "sorted by offset the ranges tile the data buffer: no gap, no overlap, ending where the file ends"),
        ("SafeTensors.open", "2.3", "memory-map the file read-only and parse its header; nothing else is read"),
        ("SafeTensors.raw", "2.3", "a zero-copy view at data_start + begin (the offsets are from the data buffer: s11)"),
        ("SafeTensors.f32", "2.3", "one tensor widened, its shape checked"),
        ("SafeTensors.f32_into", "2.3", "the jobs of _widening, run by the given tl_lab.ops.widening.widen_all"),
        ("SafeTensors._widening", "2.3", "F16 and BF16 each widened AS ITSELF (reading BF16 as F16 is s12)"),
        ("SafeTensors.q4", "2.5", "<name>.qweight U8 and <name>.scales F16 with the shapes of the group, metadata quant matching"),
        ("Linear.forward", "2.4", "y = x W^T through the given `product_f32` (imported from tl_lab.ops.lazy_kernels)"),
        ("stack_linears", "2.4", "q, k, v (and gate, up) as one linear whose rows are the parts', without a copy when they lie end to end"),
        ("tensor_shapes", "2.3", "every tensor a config implies, with its shape, in model order"),
        ("_iter_shapes", "2.3", "embed, per layer the norms and linears, the final norm, lm_head unless tied"),
        ("file_quant", "2.5", "the metadata quant tag of an int4 file, else None"),
        ("load_weights", "2.3", "config, the reader, the names and count checked, then the bigram table or the Llama weights"),
        ("_check_tensor_count", "2.3", "as many tensors as the config implies"),
        ("_check_names", "2.3", "every expected name present with its shape; an unknown one refused"),
        ("_load_llama", "2.3", "the float32 tensors into one given tl_lab.ops.widening.Arena in model order, the linears f32 or int4"),
    ]),
    "forward": _pieces("forward", [
        ("rms_norm", "2.4", "x / sqrt(mean(x^2) + eps) * w, row by row, in float32"),
        ("silu", "2.4", "x * sigmoid(x)"),
        ("rope_inv_freq", "2.4", "{formula} for i = 0 .. D/2 - 1, float32, FALLING (reversed is s20)",
         "np.float32(1) / np.float32(theta) ** (np.arange(0, D, 2).astype(np.float32) / np.float32(D))"),
        ("rope_cos_sin", "2.4", "cos and sin of pos * inv_freq at ABSOLUTE positions, each half repeated"),
        ("rotate_half", "2.4", "(-x2, x1): pairs i and i + D/2"),
        ("rope", "2.4", "x cos + rotate_half(x) sin"),
        ("kv_location", "2.4", "position j lands in block {formula}, slot j % B (the given `key_location` of kv.py computes both)", "table[j // B]"),
        ("write_kv", "2.4", "k into slab 0, v into slab 1 (K into the V slab is s15), as f16"),
        ("Step.of", "2.4", "flatten the sequences: tokens, absolute positions start .. start + n - 1, row offsets, tables"),
        ("PoolKv.write", "2.4", "the step's k and v into the pool, at the places __init__ computed"),
        ("linear_rows", "2.4", "QLinear.forward for int4, the given `product_f32` (imported from tl_lab.ops.kernels) for float32"),
        ("llama_layer", "2.4", "RMSNorm, q k v, RoPE, write K and V, attention over the visible keys, o_proj, RMSNorm, SwiGLU with silu on the GATE (s22)"),
        ("lm_head", "2.4", "the FINAL NORM (skipping it is s16), then the head: an int4 model's int8 weights.head_q8 when it has one, else head_weight (the embedding when tied)"),
        ("llama_forward", "2.4", "RoPE at absolute pos(t) = start + i (relative to the step is s13), every layer, the last row of each sequence to the head"),
        ("bigram_forward", "2.1", "row a of the table is the logits of the byte after a"),
    ]),
    "runner": _pieces("runner", [
        ("KvConfig.pool_cfg", "2.1", "the user's blocks and block size completed with the model's KV shape"),
        ("_run_llama", "2.4", "the one call of llama_forward, its K and V into the pool"),
        ("ModelRunner.__init__", "2.1", "the weights, the pool of the model's KV shape, the block manager"),
        ("ModelRunner.load", "2.1", "load_weights of the directory, then the runner"),
        ("ModelRunner._check", "4", "every sequence checked before anything is written: a refused batch changes nothing"),
        ("ModelRunner._check_tokens", "4", "token ids inside the vocabulary (s21), positions inside the context"),
        ("ModelRunner._check_table", "4", "the table covers every position written, its blocks in use, no block written twice"),
        ("ModelRunner.forward", "4", "check, run the step, raise the fill of the blocks written"),
        ("ModelRunner._run_temporary", "4", "temporary blocks from the block manager, GIVEN BACK after the step (s17)"),
        ("ModelRunner.run_once", "4", "hidden (T, d) and the last logits on temporary blocks, returned after"),
    ]),
    "sample": _pieces("sample", [
        ("Pcg32.__init__", "2.6", "pcg-c-basic's seeding: inc = (seq << 1) | 1, state 0, step, add the seed, step"),
        ("Pcg32.next_u32", "2.6", "the LCG step and the XSH RR output of the OLD state"),
        ("Pcg32.uniform_f64", "2.6", "two draws a = next_u32(), then b = next_u32(): {formula} (the shifts swapped is s01)",
         "((a >> 5) * 2**26 + (b >> 6)) / 2**53"),
        ("mix64", "2.6", "splitmix64's finaliser"),
        ("child_seed", "2.6", "{formula}: the sum mod 2^64 (docs/spec/pcg32.md); child_seed(0, 4) is 0xF88BB8A8724C81EC",
         "mix64((seed + purpose * GOLDEN_GAMMA) % 2**64)"),
        ("stream", "2.6", "{formula}: the sequence IS the purpose id (54 is s02)", "Pcg32(child_seed(seed, purpose), purpose)"),
        ("sample", "2.6", "sample_trace's token and logprob: one code path for both"),
        ("sample_trace", "2.6", "steps 1 to 9 of docs/spec/sampling.md in order; the logprob from the PENALISED logits, BEFORE temperature (s03)"),
        ("_penalise", "2.6", "repetition over prompt AND output divides positives, MULTIPLIES negatives (s07); presence and frequency over the OUTPUT only (s06)"),
        ("_scale", "2.6", "q = l / T, refusing a q past LOGIT_LIMIT by its id"),
        ("_by_q_desc", "2.6", "ids in (q descending, id ascending) order"),
        ("_top_k", "2.6", "the first k ids in (q desc, id asc) order, returned in ascending id order; k = 0 or k >= V keeps all"),
        ("_top_p", "2.6", "walk q descending adding w / Z_k until the running sum reaches p: >= keeps the crossing id (> is s04)"),
        ("_min_p", "2.6", "keep the ids whose weight w_i is at least m"),
        ("_softmax", "2.6", "w_i / Z over the ids, Z a left-to-right sum"),
        ("_draw", "2.6", "the first id whose running sum exceeds u, walked in ASCENDING ID order (probability order is s05)"),
        ("_lsum", "2.6", "((x0 + x1) + x2) + ...: the left-to-right sum the spec asks for"),
    ]),
}


@dataclass(frozen=True)
class Graded:
    """One row of the chapter's section-4 catalogue: `name` (the chapter's), kind, what it checks,
    why it matters downstream, the `module` it grades and our pytest nodes (`file`, the function
    test_<name> and its variants test_<name>_*, and the functions `also` that hold the same promise
    for the rest of the module's interface; params in `exclude` are not graded)."""

    name: str
    kind: str
    checks: str
    why: str
    module: str
    file: str
    exclude: tuple[str, ...] = ()
    also: tuple[str, ...] = ()


def _g(name, kind, checks, why, module, file, exclude=(), also=()) -> Graded:
    return Graded(name, kind, checks, why, module, f"tests/test_{file}.py", tuple(exclude), tuple(also))


_REF = ("[fast]",)  # the sampler tests' second parameter runs the engine's vectorized twin (ops.fast_sample), not the learner's sample
CATALOGUE: tuple[Graded, ...] = (
    _g("hand_example_sampling", "unit", "section 3: top-k 3 and top-p 0.8 keep ids 1 and 3, u = 0.80209, token 3 with logprob -0.92487", "the spec's worked example, end to end", "sample", "sample", _REF),
    _g("pcg32_reference_vectors", "golden", "pcg32(42) demo line, uniform_f64, child_seed, stream outputs from pcg32.vectors.json", "one generator in every language (D10)", "sample", "sample"),
    _g("sampler_matches_l81_golden", "differential, golden", "12 cases x 12 tokens: ids and f64 logprobs bit for bit against L8.1's golden", "ol parity sampler; the engine's seeded streams equal your Python's", "sample", "sample", _REF),
    _g("greedy_takes_no_draw_and_sampling_takes_one", "property", "greedy leaves the generator untouched; a sampled token takes one uniform_f64", "draw accounting for the disaggregated hand-off (L10.6)", "sample", "sample", _REF),
    _g("top_p_keeps_the_crossing_token", "boundary", "mass exactly at p keeps the crossing id", "nucleus edge, the most common sampler bug", "sample", "sample", _REF),
    _g("penalties_follow_hf_and_openai_semantics", "unit", "repetition divides positives and multiplies negatives over prompt and output; presence and frequency over output only", "the OpenAI request fields mean what clients expect", "sample", "sample", _REF),
    _g("seeded_sampling_matches_the_distribution", "statistical", "4000 draws fit 0.4, 0.3, 0.2, 0.1 (chi-square below 16.27); a seed repeats", "the sampler draws from the right distribution", "sample", "sample", _REF),
    # where a position lands (section 3's worked example) is the pool's rule too: graded with its bounds
    _g("kv_pool_bounds_and_cache_lifecycle", "boundary", "capacity is all-or-nothing, refs balance, full blocks register, release caches, lookup reacquires", "scheduler and prefix cache share one pool", "kv", "kv",
       also=("test_key_location_is_one_rule_for_scalars_and_arrays",)),
    _g("kv_pool_evicts_the_oldest_cached_block", "boundary", "exhausted allocation evicts the oldest cached prefix", "cache policy preserves recent prefixes", "kv", "kv"),
    _g("kv_pool_rejects_zero_capacity", "boundary", "zero blocks is rejected during construction", "invalid engine configuration fails early", "kv", "kv"),
    _g("kv_pool_exports_and_imports_rust_owned_blocks", "differential", "a written f16 value survives an export/import round trip", "disaggregated decode resumes with the same cache", "kv", "kv"),
    # bf16 is f16's twin in the reader's widening (section 2.3): its rounding and round trip are graded here
    _g("f16_rounds_to_nearest_even", "boundary", "ties, overflow, subnormals, NaN; every f16 pattern round-trips", "the KV cache stores f16", "quant", "quant",
       also=("test_bf16_round_trips_every_pattern", "test_bf16_rounds_to_nearest_even")),
    _g("int4_hand_example", "unit", "section 3: nibble order and the stored-scale rule", "int4 files written by your Python load here", "quant", "quant",
       also=("test_quantize_zero_groups_and_exact_ties",)),  # ties to even in QLinear.quantize (issue 60: floor(x + 0.5) passed)
    _g("q4_linear_matches_its_dequantized_weights", "differential", "the product equals x times the dequantized weights within float tolerance", "the packed layout means what the format says", "quant", "quant"),
    # the weights the reader gives (section 4: Linear, Weights, SafeTensors.q4) are graded with it
    _g("safetensors_reader_rules", "boundary", "offsets from the data buffer, F16 and BF16 widening, gaps and trailing bytes refused", "every checkpoint goes through this reader", "model", "model",
       also=("test_load_weights_tiny_llama_tied_and_shaped", "test_load_weights_bigram", "test_linear_forward_is_x_times_w_transposed",
             "test_q4_checks_the_metadata_and_the_tensors", "test_load_weights_int4_file_and_quantize_at_load_agree",
             "test_int4_file_equals_quantize_of_the_f32_weights", "test_load_weights_refuses_tensors_that_do_not_fit")),
    _g("config_refuses_what_the_engine_cannot_run", "boundary", "scaled RoPE, sliding window, unknown arch, missing tokenizer refused at load", "wrong models fail loudly at start", "model", "model"),
    _g("bigram_checkpoint_still_serves", "conformance", "the tracer checkpoint loads and greedy continues bcd", "the Pass 1 smoke stays green (D32)", "forward", "runner"),
    _g("tiny_llama_logits_match_hf", "golden", "last-token logits within the f16 bound (1e-3 of the largest logit) of HF's float32 forward", "the whole graph: GQA, tied embeddings, BF16 file", "forward", "runner"),
    _g("tiny_llama_greedy_matches_hf", "golden", "32 greedy tokens per prompt equal HF's under the near-tie rule", "what MS-L10 compares with your Python", "forward", "runner"),
    _g("incremental_decode_equals_full_prefill", "differential", "prefill then one token per step equals one prefill, within floating-point tolerance", "chunked prefill and preemption by recompute", "forward", "runner"),
    _g("batched_forward_equals_single", "differential", "two sequences in one step agree with their alone logits within float tolerance", "continuous batching changes nothing", "forward", "runner"),
    _g("run_once_returns_its_blocks", "unit", "five one-off forwards leave every block free", "embeddings do not leak KV", "runner", "runner"),
    _g("int4_runner_matches_its_dequantized_model", "differential", "quantize-at-load equals an int4 file bit for bit and its dequantized f32 twin closely", "both int4 paths agree", "runner", "runner"),
    _g("forward_refuses_bad_batches", "boundary", "a short block table or a position past the context is Err", "the scheduler's mistakes surface, not corrupt KV", "runner", "runner"),
)


def pieces(module: str) -> tuple[Piece, ...]:
    return PIECES[module]


def graded(module: str) -> tuple[Graded, ...]:
    """The catalogue's rows that grade `module`, in the chapter's order."""
    return tuple(g for g in CATALOGUE if g.module == module)


def match(nodeid: str) -> Graded | None:
    """The catalogue row whose test pytest node `nodeid` is (or a variant of: test_<name>_*, with
    parameters), or None for a lab test that grades nothing."""
    path, _, func = nodeid.partition("::")
    base = func.split("[", 1)[0]
    for g in CATALOGUE:
        if path == g.file and (base == f"test_{g.name}" or base.startswith(f"test_{g.name}_") or base in g.also):
            return None if any(x in func for x in g.exclude) else g
    return None


def graded_for(module: str, nodeids) -> list[str]:
    """The node ids among `nodeids` that grade `module`."""
    return [n for n in nodeids if (g := match(n)) is not None and g.module == module]
