"""The forwards: the byte bigram and the Llama graph of one step. Chapter L10.1, sections 2.4 and 2.5.

One step runs S sequences; sequence s brings n_s new tokens at absolute positions p_s .. p_s+n_s-1,
and the step's hidden states are the rows of x: (N, d), N = sum n_s, in batch order:

    x = embed[tokens]
    per layer:  h = RMSNorm(x) w_in;  q, k, v = h W_q^T, h W_k^T, h W_v^T;  RoPE(q, k) at pos(t)
                write k, v as f16 into the sequence's blocks (position j -> table[j // B], slot j % B)
                o_t = sum_{j <= pos(t)} softmax_j(q_t . k_j / sqrt(D)) v_j   (k_j, v_j read back, f16)
                x += o W_o^T;  h2 = RMSNorm(x) w_post;  x += (silu(h2 W_g^T) * (h2 W_u^T)) W_d^T
    logits = RMSNorm(x[last token of s]) w_norm  W_head^T     (W_head = embed when tied)

`llama_forward` reads like the equations: one `llama_layer` per layer over the step's rows, the KV
cache behind two calls (`PoolKv.write` and `.attend`: the f16 pool, read in place; `F32Kv`: the
float32 reference), the notebook's trace an optional `Recorder` that costs nothing when absent.
Every piece is a small pure function (`rms_norm`, `rope`, ...) the notebook reuses; there is no
second copy of the forward.

Batch invariance (section 2.4) rests on one rule: every operation that mixes numbers either works
inside one row (the norms, RoPE, SwiGLU, the embedding) or inside one sequence (attention), or is a
product with a weight matrix whose every output is one compiled sum in a fixed order
(`tl_lab.ops.kernels`, through `linear_rows`: every kernel adds a sum in the order `tl_lab.ops.lanes`
writes out, whichever kernel the batch size picks), so a sequence gets the same bits whatever else
is in the step.
W_q, W_k, W_v and W_gate, W_up are stacked at load (`LlamaLayer.qkv`, `.gate_up`): one product
each, whose every output is the same loop as in the part's own product. `gather_kv` + `attend`
(given, `tl_lab.ops.attention`) are the readable attention the kernel is tested against; the numpy products (`matmul_rows` with
its 8-row tiles, the plain ``x @ W.T`` of product="plain") are given in `tl_lab.ops.products`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tl_lab.kv import key_location
from tl_lab.model import Linear, LlamaWeights
from tl_lab.ops.attention import F32Kv, PagedAttention, Recorder, attend, attend_reference, causal_mask, gather_kv, softmax
from tl_lab.ops.kernels import head_f32, product_f32
from tl_lab.ops.products import PRODUCTS, Scratch, weight_t
from tl_lab.quant import QLinear, f32_to_f16

__all__ = ["rms_norm", "silu", "rope_inv_freq", "rope_cos_sin", "rotate_half", "rope", "kv_location", "write_kv",
           "Step", "PoolKv", "linear_rows", "linear_fn", "llama_layer", "llama_forward", "lm_head", "bigram_forward",
           # given, from tl_lab.ops.attention: the readable attention, the f32 cache and the notebook's trace
           "gather_kv", "causal_mask", "softmax", "attend", "F32Kv", "attend_reference", "Recorder"]

# ---------------------------------------------------------------------------------------------
# Row-local pieces: RMSNorm, SwiGLU, RoPE
# ---------------------------------------------------------------------------------------------


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * w, per row. x: (N, d) float32 (or any shape (..., d): the last
    axis is the one normalized, as in Hugging Face), w: (d,) -> the shape of x, float32.

    Hugging Face's order: the reciprocal square root multiplies x, then the weight. The mean is a
    numpy reduction along the last axis of a C-contiguous array, which sums each row by itself
    (tests check a row alone and in a stack agree bit for bit). It is written as a sum over d
    rather than np.mean: the same sum and the same bits (mean divides in float64 and rounds once
    to float32, which is the float32 division exactly), without mean's Python layer.
    """
    ms = (x * x).sum(axis=-1, keepdims=True) / np.float32(x.shape[-1])
    return (x * (np.float32(1.0) / np.sqrt(ms + np.float32(eps)))) * w


def silu(g: np.ndarray) -> np.ndarray:
    """silu(g) = g * sigmoid(g) = g / (1 + exp(-g)), elementwise float32. Applied to the GATE projection.
    (Computed in one buffer: a prefill's 512 x 1536 gates made four temporaries otherwise.)"""
    e = np.exp(-g)
    e += np.float32(1.0)
    return np.divide(g, e, out=e)


def rope_inv_freq(D: int, theta: float) -> np.ndarray:
    """inv_freq_i = theta^(-2i/D), i = 0 .. D/2-1, float32, computed as Hugging Face does it.

    The exponent 2i/D and the power are float32 operations, then 1 / power. Frequencies fall
    with i: pair 0 turns fastest (one radian per position), the last pair slowest.
    """
    exponent = np.arange(0, D, 2, dtype=np.int64).astype(np.float32) / np.float32(D)
    return np.float32(1.0) / (np.float32(theta) ** exponent)


def rope_cos_sin(pos: np.ndarray, D: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of the angles pos * inv_freq, each (N, D) float32, the D/2 angles twice.

    The angle of pair i at position p is p * inv_freq_i (one float32 product, as HF's matmul of
    an inner size 1); the half-split layout pairs element i with element i + D/2, so the table
    repeats the D/2 angles for both halves.
    """
    angles = np.asarray(pos).astype(np.float32)[:, None] * rope_inv_freq(D, theta)[None, :]
    angles = np.concatenate([angles, angles], axis=-1)
    return np.cos(angles), np.sin(angles)


def rotate_half(x: np.ndarray) -> np.ndarray:
    """(x1, x2) -> (-x2, x1) over the last axis split in halves (HF's rotate_half)."""
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate each pair (x_i, x_{i+D/2}) of every head by its angle. x: (N, heads, D) float32,
    cos, sin: (N, D) from `rope_cos_sin` at the tokens' absolute positions -> (N, heads, D)."""
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


# ---------------------------------------------------------------------------------------------
# The KV cache: where a key lands, writing it, reading a sequence's keys back
# ---------------------------------------------------------------------------------------------


def kv_location(table: np.ndarray, pos: np.ndarray, B: int) -> tuple[np.ndarray, np.ndarray]:
    """Position j lives in pool block table[j // B], slot j % B (section 3). Arrays in, arrays out."""
    return key_location(table, pos, B)[1:]  # the one rule, in tl_lab.kv


def write_kv(data: np.ndarray, layer: int, blk: np.ndarray, slot: np.ndarray,
             k: np.ndarray, v: np.ndarray) -> None:
    """Write the step's keys and values as f16 into the pool, both in one vectorized write.

    data: the pool buffer (n_blocks, n_layers, 2, H_kv, B, D) uint16 (axis 2: 0 = K, 1 = V);
    blk, slot: (N,) pool block and slot of each row; k, v: (N, H_kv, D) float32. K and V side by
    side, (N, 2, H_kv, D), are rounded and written in one go.
    """
    data[blk, layer, :, :, slot, :] = f32_to_f16(np.stack([k, v], axis=1))  # axis 1: 0 = K, 1 = V


# ---------------------------------------------------------------------------------------------
# The step
# ---------------------------------------------------------------------------------------------


@dataclass
class Step:
    """One step's sequences, flattened (built by the runner after its checks).

    tokens, pos: (N,) int64, the new tokens and their absolute positions, in batch order;
    offsets: (S + 1,) row offsets, sequence s owns rows offsets[s] .. offsets[s+1]-1;
    starts: (S,) p_s; tables: S block tables (int arrays).
    """

    tokens: np.ndarray
    pos: np.ndarray
    offsets: np.ndarray
    starts: np.ndarray
    tables: list[np.ndarray]

    @classmethod
    def of(cls, seqs) -> Step:
        """From (tokens, start, table) triples."""
        toks = [np.asarray(t, dtype=np.int64).reshape(-1) for t, _, _ in seqs]
        starts = np.asarray([int(s) for _, s, _ in seqs], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum([len(t) for t in toks])]).astype(np.int64)
        pos = np.concatenate([s + np.arange(len(t)) for t, s in zip(toks, starts)]).astype(np.int64)
        tables = [np.asarray(b, dtype=np.int64).reshape(-1) for _, _, b in seqs]
        return cls(np.concatenate(toks), pos, offsets, starts, tables)

    @property
    def n_seqs(self) -> int:
        return len(self.starts)

    @property
    def last(self) -> np.ndarray:
        """(S,) the row of each sequence's last new token."""
        return self.offsets[1:] - 1

    def rows(self, s: int) -> slice:
        return slice(int(self.offsets[s]), int(self.offsets[s + 1]))


# ---------------------------------------------------------------------------------------------
# The KV cache of one step, behind two calls: write and attend
# ---------------------------------------------------------------------------------------------


class PoolKv:
    """The step's view of the f16 KV pool (the engine): `write` puts each new token's k and v into
    its sequence's blocks; `attend` (given: `tl_lab.ops.attention.PagedAttention`) reads the blocks
    in place, each query over its visible keys only.

    data: the pool (n_blocks, n_layers, 2, H_kv, B, D) uint16, written in place; step: the step.
    `read(layer, s)` gathers one sequence's keys and values back (the numpy reference, for the trace).
    """

    def __init__(self, data: np.ndarray, step: Step) -> None:
        locs = [kv_location(step.tables[s], step.pos[step.rows(s)], data.shape[4]) for s in range(step.n_seqs)]
        self.blk, self.slot = (np.concatenate(part) for part in zip(*locs, strict=True))  # (N,) each
        self.data, self.step, self.paged = data, step, PagedAttention(data, step)

    def write(self, layer: int, k: np.ndarray, v: np.ndarray) -> None:
        write_kv(self.data, layer, self.blk, self.slot, k, v)

    def attend(self, layer: int, q: np.ndarray) -> np.ndarray:
        """q: (N, H, D) float32 -> o: (N, H * D) float32."""
        return self.paged.attend(layer, q)

    def read(self, layer: int, s: int) -> tuple[np.ndarray, np.ndarray]:
        return self.paged.read(layer, s)


# ---------------------------------------------------------------------------------------------
# The forward of one step
# ---------------------------------------------------------------------------------------------


def linear_rows(h: np.ndarray, lin: Linear | QLinear) -> np.ndarray:
    """The engine's product of a step's rows, h: (N, K) float32 -> (N, out) float32 (section 2.4).

    An int4 linear runs `QLinear.forward`, a float32 one `kernels.product_f32`: a lone row (a
    batch-1 decode) through the one-row kernel, any other batch through blocks of rows. Every
    kernel adds each sum in `lanes` order, so a row's bits do not depend on which one the batch
    picked, nor on the rest of the batch.
    """
    if isinstance(lin, QLinear):
        return lin.forward(h)
    return product_f32(h, lin.w)


def linear_fn(product: str = "invariant", scratch: Scratch | None = None):
    """The product of a step: "invariant" (`linear_rows`: the compiled kernels, row-invariant, the
    engine's) or "plain" (numpy's ``x @ W.T``, the batch-dependent baseline)."""
    if product == "invariant":
        return linear_rows
    if product == "plain":
        return lambda h, lin: h @ weight_t(lin, scratch)
    raise ValueError(f"product must be one of {PRODUCTS}, got {product!r}")


def llama_layer(layer, l: int, x: np.ndarray, cos: np.ndarray, sin: np.ndarray, cache, linear,
                c, rec: Recorder | None = None) -> np.ndarray:
    """One decoder layer (section 2.4) on the step's rows x: (N, d) float32 -> (N, d) float32."""
    N, H, H_kv, D, eps = x.shape[0], c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.rms_norm_eps
    I, b = c.intermediate_size, (H + H_kv) * D  # q and k are the stacked outputs' first b columns, v the rest
    h = rms_norm(x, layer.input_layernorm, eps)                          # (N, d)
    qkv = linear(h, layer.qkv)                                           # (N, (H + 2 H_kv) D): W_q, W_k, W_v stacked
    qk = rope(qkv[:, :b].reshape(N, H + H_kv, D), cos, sin)              # (N, H + H_kv, D): q's heads, then k's
    q, k = qk[:, :H], qk[:, H:]                                          # (N, H, D), (N, H_kv, D)
    v = qkv[:, b:].reshape(N, H_kv, D)                                   # (N, H_kv, D)
    cache.write(l, k, v)                                                 # f16 into the blocks
    o = cache.attend(l, q)                                               # (N, H * D), keys j <= pos(t)
    x = x + linear(o, layer.o_proj)                                      # (N, d)
    h2 = rms_norm(x, layer.post_attention_layernorm, eps)                # (N, d)
    gu = linear(h2, layer.gate_up)                                       # (N, 2 I): W_gate, W_up stacked
    gate = silu(gu[:, :I])                                               # (N, I), silu on the GATE
    x = x + linear(gate * gu[:, I:], layer.down_proj)                    # (N, d)
    if rec is not None:
        rec.layer(cache, l, q, k, v, x)
    return x


def lm_head(weights: LlamaWeights, x_last: np.ndarray, product: str = "invariant") -> np.ndarray:
    """Final RMSNorm and the LM head (the embedding when tied). x_last: (S, d) -> (S, V) float32.

    The invariant product here is the compiled `kernels.head_f32` (`product_f32`), or an int4
    model's int8 head (`LlamaWeights.head_q8`): the weight is read from memory once per step,
    whatever the number of sequences."""
    c = weights.config
    h = rms_norm(x_last, weights.norm, c.rms_norm_eps)  # the final norm
    if product == "plain":
        return h @ weights.head_hat.T
    if product != "invariant":
        raise ValueError(f"product must be one of {PRODUCTS}, got {product!r}")
    if weights.head_q8 is not None:
        return weights.head_q8.forward(h)
    return head_f32(h, weights.head_weight)


def llama_forward(weights: LlamaWeights, step: Step, data: np.ndarray | None, *,
                  product: str = "invariant", kv: str = "pool", scratch: Scratch | None = None,
                  return_hidden: bool = False, trace: dict | None = None):
    """Run one step of the Llama graph (section 2.4) and return each sequence's last-token logits.

    weights: f32 or int4 linears; step: the flattened sequences; data: the KV pool's buffer
    (n_blocks, n_layers, 2, H_kv, B, D) uint16, written in place.
    -> logits (S, V) float32, or (logits, hidden) with return_hidden, hidden (N, d) float32 the
    final-normed hidden state of every new token (what Hugging Face calls last_hidden_state).

    kv="pool" is the engine (`PoolKv`); kv="f32" the float32 reference (`F32Kv`) the f16 bound is
    measured against. product: "invariant" (the compiled kernels) or "plain" (``x @ W.T``).
    trace: a dict that collects the internals for the notebook (`Recorder`).
    """
    c = weights.config
    if kv not in ("pool", "f32"):
        raise ValueError(f"kv must be 'pool' or 'f32', got {kv!r}")
    linear = linear_fn(product, scratch)
    cache = PoolKv(data, step) if kv == "pool" else F32Kv(step)
    rec = None if trace is None else Recorder(trace)
    cos, sin = rope_cos_sin(step.pos, c.head_dim, c.rope_theta)  # (N, D): RoPE at absolute pos(t)
    x = weights.embed[step.tokens]                                 # (N, d), a gather: a copy
    if rec is not None:
        rec.embed(x)
    for l, layer in enumerate(weights.layers):
        x = llama_layer(layer, l, x, cos, sin, cache, linear, c, rec)
    logits = lm_head(weights, x[step.last], product)               # (S, V)
    if return_hidden:
        return logits, rms_norm(x, weights.norm, c.rms_norm_eps)
    return logits


def bigram_forward(table: np.ndarray, last_tokens: np.ndarray) -> np.ndarray:
    """The byte bigram (L10.0): row a of `table` (V, V) is the logits of the byte after a.
    last_tokens: (S,) -> (S, V) float32, a copy."""
    return table[np.asarray(last_tokens, dtype=np.int64)].astype(np.float32, copy=True)
