"""tl_lab/forward.py: the row-local pieces, the cache and the layer (chapter L10.1, section 2.4).

The chapter-named end-to-end tests (HF parity, batch and chunk invariance of the whole forward)
are in test_runner.py; here are the building blocks (the numpy products: test_products.py).
"""

import numpy as np
import pytest

from refusal import names_all, raises_naming
from tl_lab.forward import (
    Step,
    attend,
    causal_mask,
    gather_kv,
    kv_location,
    llama_forward,
    rms_norm,
    rope,
    rope_cos_sin,
    rope_inv_freq,
    rotate_half,
    silu,
    softmax,
    write_kv,
)
from tl_lab.quant import f16_to_f32, f32_to_f16

# ------------------------------------------------------------------ row-local pieces


@pytest.mark.parametrize("d", [16, 64, 576, 1536])
def test_row_local_ops_give_a_row_the_same_bits_alone_and_stacked(d):
    """RMSNorm, SwiGLU, softmax and RoPE work row by row: numpy's reductions along the last axis
    of a 2D array sum each row by itself."""
    rng = np.random.default_rng(d)
    w = (1 + 0.1 * rng.standard_normal(d)).astype(np.float32)
    X = rng.standard_normal((40, d)).astype(np.float32) * 3
    D = 64 if d % 64 == 0 else 16
    pos = rng.integers(0, 500, size=40)
    cos, sin = rope_cos_sin(pos, D, 10000.0)
    stacked = {
        "rms_norm": rms_norm(X, w, 1e-5),
        "silu": silu(X) * X,
        "softmax": softmax(X),
        "rope": rope(X.reshape(40, -1, D), cos, sin).reshape(40, d),
    }
    for r in (0, 7, 39):
        alone = {
            "rms_norm": rms_norm(X[r : r + 1], w, 1e-5),
            "silu": silu(X[r : r + 1]) * X[r : r + 1],
            "softmax": softmax(X[r : r + 1]),
            "rope": rope(X[r : r + 1].reshape(1, -1, D), cos[r : r + 1], sin[r : r + 1]).reshape(1, d),
        }
        for name in stacked:
            assert np.array_equal(stacked[name][r], alone[name][0]), f"{name} row {r}"


def test_rms_norm_formula():
    x = np.array([[3.0, 4.0]], np.float32)
    w = np.array([1.0, 2.0], np.float32)
    rms = np.sqrt((9 + 16) / 2 + 1e-5)
    np.testing.assert_allclose(rms_norm(x, w, 1e-5), [[3 / rms, 8 / rms]], rtol=1e-6)


def test_rms_norm_normalizes_the_last_axis_whatever_the_leading_shape():
    """As Hugging Face's LlamaRMSNorm: over the last axis of (d,), (N, d) or (B, T, d) alike, each
    vector with the bits it has as a row of a 2-D stack."""
    rng = np.random.default_rng(5)
    w = (1 + 0.1 * rng.standard_normal(24)).astype(np.float32)
    X = rng.standard_normal((2, 3, 24)).astype(np.float32) * 4
    rows = rms_norm(X.reshape(6, 24), w, 1e-5)
    assert np.array_equal(rms_norm(X, w, 1e-5).reshape(6, 24), rows)
    assert np.array_equal(rms_norm(X[1, 2], w, 1e-5), rows[5])


def test_silu_is_x_sigmoid_x():
    g = np.linspace(-8, 8, 33, dtype=np.float32)
    np.testing.assert_allclose(silu(g), g / (1 + np.exp(-g.astype(np.float64))), rtol=1e-6, atol=1e-7)


def test_rope_inv_freq_falls_and_matches_the_formula():
    f = rope_inv_freq(16, 10000.0)
    assert f.dtype == np.float32 and f.shape == (8,)
    assert f[0] == 1.0 and np.all(np.diff(f) < 0)  # pair 0 turns fastest
    np.testing.assert_allclose(f, 10000.0 ** (-np.arange(0, 16, 2) / 16), rtol=1e-6)


def test_rope_rotates_pairs_i_and_i_plus_half():
    """Half-split layout: (x_i, x_{i+D/2}) turns by pos * inv_freq_i; norms are kept."""
    D, p = 8, 5
    x = np.zeros((1, 1, D), np.float32)
    x[0, 0, 1] = 1.0  # pair 1 = (x_1, x_5) = (1, 0)
    cos, sin = rope_cos_sin(np.array([p]), D, 10000.0)
    y = rope(x, cos, sin)[0, 0]
    theta = p * 10000.0 ** (-2 / D)
    np.testing.assert_allclose([y[1], y[5]], [np.cos(theta), np.sin(theta)], atol=1e-6)
    assert np.count_nonzero(np.abs(y) > 1e-7) == 2
    v = np.random.default_rng(0).standard_normal((3, 2, D)).astype(np.float32)
    cos, sin = rope_cos_sin(np.array([0, 1, 300]), D, 10000.0)
    r = rope(v, cos, sin)
    np.testing.assert_allclose(np.linalg.norm(r, axis=-1), np.linalg.norm(v, axis=-1), rtol=1e-5)
    assert np.array_equal(r[0], v[0])  # position 0 is no rotation
    assert np.array_equal(rotate_half(np.arange(4.0)), [-2.0, -3.0, 0.0, 1.0])


# ------------------------------------------------------------------ the KV pool and attention


def test_where_a_key_lands_section_3():
    blk, slot = kv_location(np.array([7, 2, 9]), np.array([37, 0, 16]), 16)
    assert blk.tolist() == [9, 7, 2] and slot.tolist() == [5, 0, 0]


def test_write_then_gather_round_trips_through_f16():
    rng = np.random.default_rng(11)
    n_blocks, L_layers, H_kv, B, D = 6, 2, 2, 4, 8
    data = np.zeros((n_blocks, L_layers, 2, H_kv, B, D), np.uint16)
    table = np.array([5, 1, 3])
    pos = np.arange(10)
    k = rng.standard_normal((10, H_kv, D)).astype(np.float32)
    v = rng.standard_normal((10, H_kv, D)).astype(np.float32)
    blk, slot = kv_location(table, pos, B)
    write_kv(data, 1, blk, slot, k, v)
    # section 3: K of head h at slot j starts at flat element (h * B + j) * D of the K slab
    flat = data[table[9 // B]].reshape(L_layers, 2, -1)[1, 0]  # block 3 holds positions 8..11
    assert np.array_equal(flat[(1 * B + 1) * D : (1 * B + 1) * D + D], f32_to_f16(k[9, 1]))
    K, V = gather_kv(data, 1, table, 10)
    assert K.shape == (H_kv, 10, D)
    assert np.array_equal(K, f16_to_f32(f32_to_f16(k)).transpose(1, 0, 2))
    assert np.array_equal(V, f16_to_f32(f32_to_f16(v)).transpose(1, 0, 2))
    assert not data[:, 0].any()  # layer 0 untouched
    assert not data[[0, 2, 4]].any()  # blocks outside the table untouched


def test_causal_mask_uses_the_start_as_q_offset():
    m = causal_mask(3, 2, 5)
    assert m.tolist() == [[True] * 4 + [False], [True] * 5]


def test_attend_matches_a_loop_over_heads_and_visible_keys():
    rng = np.random.default_rng(12)
    n, H, H_kv, D, start = 3, 4, 2, 8, 4
    L = start + n
    q = rng.standard_normal((n, H, D)).astype(np.float32)
    K = rng.standard_normal((H_kv, L, D)).astype(np.float32)
    V = rng.standard_normal((H_kv, L, D)).astype(np.float32)
    o, w = attend(q, K, V, start, return_weights=True)
    ref = np.zeros((n, H, D))
    for t in range(n):
        for h in range(H):
            g = h // (H // H_kv)
            vis = start + t + 1
            s = K[g, :vis].astype(np.float64) @ q[t, h] / np.sqrt(D)
            p = np.exp(s - s.max())
            p /= p.sum()
            ref[t, h] = p @ V[g, :vis]
            assert np.all(w[h, t, vis:] == 0)
    np.testing.assert_allclose(o.reshape(n, H, D), ref, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# The forward on the kernels against the numpy reference
# ---------------------------------------------------------------------------------------------


def _tiny_runner(**kw):
    from tl_lab.ops.paths import DATA_DIR
    from tl_lab.runner import EngineConfig, KvConfig, ModelRunner

    return ModelRunner.load(DATA_DIR / "tiny-llama", EngineConfig(kv=KvConfig(n_blocks=32), **kw))


def test_kernel_forward_equals_the_numpy_reference_forward(monkeypatch):
    """The engine's forward (compiled products, paged attention) against the same graph on numpy's
    plain products and the gather-and-mask attention: the same logits within float tolerance."""
    import tl_lab.forward as fw

    runner = _tiny_runner()
    toks = list(b"The kernels and the reference agree.")
    table = runner.pool.alloc(3)
    step = Step.of([(toks[:20], 0, table)])
    z_kernel = llama_forward(runner.weights, step, runner.pool.data)
    monkeypatch.setattr(fw.PoolKv, "attend", lambda self, layer, q: fw.attend_reference(self, layer, q))
    z_ref = llama_forward(runner.weights, step, runner.pool.data, product="plain")
    np.testing.assert_allclose(z_kernel, z_ref, rtol=0, atol=1e-4 * float(np.abs(z_ref).max()))


@pytest.mark.parametrize("model, golden", [("tiny-llama", "tiny_llama_hf.json"),
                                            ("tiny-llama-untied", "tiny_llama_untied_hf.json")])
def test_the_f32_forward_matches_hf_tied_and_untied(model, golden):
    """llama_forward with float32 keys (kv='f32', no pool) against HF's float32 forward to 1e-4, for
    the tied model and the untied one (its own lm_head.weight, issue 62): the head the graph uses is
    the one the checkpoint names."""
    from tl_lab.lab.compare import hf_golden_cases
    from tl_lab.model import load_weights
    from tl_lab.ops.paths import DATA_DIR, GOLDEN_DIR

    w = load_weights(DATA_DIR / model)
    assert (w.lm_head is None) == w.config.tie_word_embeddings
    for case in hf_golden_cases(GOLDEN_DIR / golden):
        z = llama_forward(w, Step.of([(case["tokens"], 0, [])]), None, kv="f32")[0]
        err = float(np.abs(z - case["z"]).max())
        assert err <= 1e-4, f"{model}, {len(case['tokens'])}-token prompt: max |z - z_hf| = {err:.3g}"


def test_trace_records_the_internals_and_costs_nothing_when_absent(monkeypatch):
    from tl_lab.ops import attention

    runner = _tiny_runner()
    c = runner.config
    table = runner.pool.alloc(2)
    step = Step.of([(list(b"trace me"), 0, table)])
    calls = []
    real = attention.attend_reference
    monkeypatch.setattr(attention, "attend_reference", lambda *a: calls.append(1) or real(*a))
    z = llama_forward(runner.weights, step, runner.pool.data)
    assert calls == []  # no recorder: no reference attention, no copies
    trace = {}
    assert np.array_equal(llama_forward(runner.weights, step, runner.pool.data, trace=trace), z)
    L = c.num_hidden_layers
    assert len(trace["x"]) == L + 1 and len(trace["q"]) == len(trace["attn"]) == L and len(calls) == L
    assert np.array_equal(trace["x"][0], runner.weights.embed[step.tokens])  # the embedding's rows first
    assert trace["q"][0].shape == (8, c.num_attention_heads, c.head_dim)
    assert trace["attn"][0][0].shape == (c.num_attention_heads, 8, 8)


def test_the_pool_view_of_a_step_names_each_rows_sequence_block_and_tile():
    """PoolKv's arrays are what the paged attention kernel trusts without a bounds check: for a step
    of three sequences (4, 1 and 20 new tokens), each row's block and slot, its sequence, each
    sequence's first row, and query tiles that never span two sequences."""
    import tl_lab.forward as fw

    runner = _tiny_runner()
    B = runner.pool.data.shape[4]
    tables = [runner.pool.alloc(3), runner.pool.alloc(1), runner.pool.alloc(3)]
    step = Step.of([(list(b"abcd"), 5, tables[0]), (list(b"e"), 0, tables[1]), (list(range(20)), 3, tables[2])])
    from tl_lab.ops.kernels import QUERY_TILE

    view = fw.PoolKv(runner.pool.data, step)
    paged = view.paged  # the given side: tl_lab.ops.attention.PagedAttention
    assert paged.seq_of.tolist() == [0] * 4 + [1] + [2] * 20
    assert paged.firsts.tolist() == [0, 4, 5]
    assert paged.tiles.tolist() == [0, 4, 5, 5 + QUERY_TILE, 25]
    pos = step.pos
    assert view.blk.tolist() == [int(tables[s][p // B]) for s, p in zip(paged.seq_of, pos)]
    assert view.slot.tolist() == [int(p % B) for p in pos]
    assert paged.tables.shape == (3, 3) and paged.tables[1, 0] == tables[1][0]


# ------------------------------------------------------------------ stacked q/k/v and gate/up


@pytest.mark.parametrize("quant", [None, "int4"])
def test_stacked_linears_give_each_part_its_own_bits(quant):
    """One product of a layer's stack (W_q, W_k, W_v; W_gate, W_up) gives every part's outputs bit
    for bit as the part's own product does, for decode rows and a long prefill span alike; the
    parts are views of the stack's rows (one copy of each weight), and a loaded model's stack is
    the very rows its parts were widened into, in the one buffer of all its float32 weights
    (nothing copied at load)."""
    from tl_lab.forward import linear_rows
    from tl_lab.ops.products import LONG_ROWS
    from tl_lab.model import Linear, LlamaLayer, stack_linears
    from tl_lab.quant import QLinear
    from tl_lab.runner import Int4

    runner = _tiny_runner(**({"quant": Int4(32)} if quant else {}))
    layer = runner.weights.layers[0]
    rng = np.random.default_rng(7)
    for n in (1, 3, LONG_ROWS + 3):  # the one-row kernel, a small block, a long prefill
        h = rng.standard_normal((n, layer.q_proj.inp)).astype(np.float32)
        for stack, parts in ((layer.qkv, ("q_proj", "k_proj", "v_proj")), (layer.gate_up, ("gate_proj", "up_proj"))):
            together = linear_rows(h, stack)
            apart = np.concatenate([linear_rows(h, getattr(layer, p)) for p in parts], axis=1)
            assert np.array_equal(together, apart)
    if quant:
        assert isinstance(layer.qkv, QLinear) and np.shares_memory(layer.q_proj.planar, layer.qkv.planar)
    else:
        w = runner.weights  # one arena holds every float32 weight; a stack is its parts' own rows there
        assert all(a.base is w.embed.base for a in (layer.qkv.w, layer.gate_up.w, layer.input_layernorm, w.norm))
        assert layer.q_proj.w.ctypes.data == layer.qkv.w.ctypes.data
        assert layer.up_proj.w.ctypes.data == layer.gate_up.w.ctypes.data + layer.gate_proj.w.nbytes
    again = LlamaLayer(**{f: getattr(layer, f) for f in LlamaLayer.__dataclass_fields__ if f not in ("qkv", "gate_up")})
    assert again.qkv is not layer.qkv  # a new layer stacks its own linears
    with raises_naming(ValueError, "all float32 or all int4", "forward"):
        stack_linears([Linear(np.ones((4, 8), np.float32)), QLinear.quantize(np.ones((4, 8), np.float32), 8)])
