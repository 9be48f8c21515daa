"""The notebooks' figures: drawing code kept out of the teaching cells.

Each function draws one notebook figure from numbers the cell computed and returns the Figure (the
cell shows it with plt.show()). Where the layout matters (a label clear of the dots, a legend clear
of the bars), the function lays it out; tests/test_plots.py checks the layout, so the notebooks
hold only the facts they teach.
"""

from __future__ import annotations

import numpy as np


def _plt():
    import matplotlib.pyplot as plt

    return plt


def on_chart(ax, artist) -> bool:
    """Whether `artist`'s box lies wholly inside `ax`'s box (drawn, not clipped away)."""
    box, frame = artist.get_window_extent(), ax.get_window_extent()
    return box.height > 0 and frame.contains(*box.min) and frame.contains(*box.max)


# ------------------------------------------------------------------ 05_forward


def step_blocks(blk, slot, pos, done: int, B: int):
    """The positions of one sequence in its blocks: one row per block, one square per slot, the
    tokens already in the cache (pos < done) in grey and the step's new ones in colour."""
    plt = _plt()
    n_rows = int(np.max(blk)) + 1 if len(blk) else 1
    fig, ax = plt.subplots(figsize=(9, 0.6 * n_rows + 1.0))
    grid = np.full((n_rows, B), np.nan)
    table = sorted(set(int(b) for b in blk))
    row = {b: i for i, b in enumerate(table)}
    for b, s, p in zip(blk, slot, pos):
        grid[row[int(b)], int(s)] = 0 if p < done else 1
    ax.imshow(grid, cmap="coolwarm", vmin=-0.5, vmax=1.5, aspect="auto")
    for b, s, p in zip(blk, slot, pos):
        ax.text(int(s), row[int(b)], str(int(p)), ha="center", va="center", fontsize=7)
    ax.set_yticks(range(len(table)), [f"block {b}" for b in table])
    ax.set_xticks(range(B), [str(s) for s in range(B)], fontsize=7)
    ax.set_xlabel(f"slot (position % {B}); blue: in the cache before the step, red: the step's new tokens")
    fig.tight_layout()
    return fig


def rope_pairs(rope, inv_freq, D: int, theta: float, pairs=(0, 1, 3, 7), positions: int = 11):
    """A unit vector in each pair of `pairs`, turned by `rope` at positions 0 .. positions - 1:
    one panel per pair, the dots coloured by position, a few positions labelled beside their dot."""
    from tl_lab.forward import rope_cos_sin

    plt = _plt()
    pos = np.arange(positions)
    cos, sin = rope_cos_sin(pos, D, theta)
    fig, axes = plt.subplots(1, len(pairs), figsize=(3.25 * len(pairs), 3.3))
    circle = np.linspace(0, 2 * np.pi, 100)
    for ax, i in zip(np.atleast_1d(axes), pairs):
        e = np.zeros((len(pos), 1, D), np.float32)
        e[:, 0, i] = 1.0  # (x_i, x_{i+D/2}) = (1, 0) at every position
        r = rope(e, cos, sin)[:, 0]
        ax.plot(np.cos(circle), np.sin(circle), c="0.85")
        ax.scatter(r[:, i], r[:, i + D // 2], c=pos, cmap="viridis", zorder=3)
        for p in sorted({0, 1, 2, positions - 1}):
            ax.annotate(str(p), (r[p, i], r[p, i + D // 2]), xytext=(6, 6), textcoords="offset points", fontsize=8,
                        bbox=dict(boxstyle="round,pad=0.1", fc="white", ec="none", alpha=0.8))
        ax.set_title(f"pair {i}: {inv_freq[i]:.3g} rad/position")
        ax.set_aspect("equal")
        ax.set_xlim(-1.3, 1.3)
        ax.set_ylim(-1.3, 1.3)
    fig.suptitle(f"RoPE: one pair of the head vector, positions 0..{positions - 1}")
    fig.tight_layout()
    return fig


def attention_heads(w, start: int, blocks, heads, group: int):
    """Attention weights (H, n, L) of one sequence: one heatmap per head in `heads`, the causal edge
    j = start + t drawn over it."""
    plt = _plt()
    n = w.shape[1]
    fig, axes = plt.subplots(1, len(heads), figsize=(6 * len(heads), 3.4))
    for ax, h in zip(np.atleast_1d(axes), heads):
        im = ax.imshow(w[h], aspect="auto", cmap="magma")
        ax.plot(start + np.arange(n), np.arange(n), "c--", lw=1, label="j = pos(t)")
        ax.set_xlabel(f"key position j (from blocks {list(blocks)})")
        ax.set_ylabel(f"query t (position {start} + t)")
        ax.set_title(f"query head {h} (KV head {h // group})")
        ax.legend(loc="lower left", fontsize=8)
        fig.colorbar(im, ax=ax)
    fig.tight_layout()
    return fig


def f16_error(err, bound: float, largest: float):
    """The logits' distance between an f16 and an f32 KV cache, per position, under the bound
    (1e-3 of the largest logit); the legend below the axes, clear of the line."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 3.6))
    ax.plot(err, lw=0.8, label="max |logit(f16 cache) - logit(f32 cache)| per position")
    ax.axhline(bound, c="r", ls="--", label=f"the bound: 1e-3 of the largest logit ({largest:.1f}) = {bound:.3f}")
    ax.set_xlabel("position")
    ax.set_yscale("log")
    ax.legend(fontsize=8, ncol=1, loc="upper center", bbox_to_anchor=(0.5, -0.22))
    fig.tight_layout()
    return fig


def against_hf(errors, bounds, labels, reference=None, yours=()):
    """The runner's distance from HF's float32 logits per prompt, against each prompt's bound; with
    `reference` (the reference runner's errors), both side by side."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 3))
    xs = np.arange(len(errors))
    wid = 0.5 if reference is None else 0.3
    ax.bar(xs, errors, wid, color="tab:blue",
           label="max |runner logit - HF logit|" + (f" (yours: {', '.join(yours)})" if reference is not None else ""))
    if reference is not None:
        ax.bar(xs + wid, reference, wid, color="tab:gray", label="the same, the reference's runner")
    ax.plot(xs, bounds, "r_", ms=30, mew=2, label="the bound: 1e-3 of the largest logit")
    ax.set_xticks(xs, labels)
    ax.set_yscale("log")
    ax.set_ylim(min(list(errors) + list(reference if reference is not None else [])) / 3, max(bounds) * 8)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title("last-token logits against Hugging Face (f16 KV cache)")
    fig.tight_layout()
    return fig


def invariance(batch: dict[str, list[int]], chunk: dict[str, dict[str, int]], vocab: int):
    """Two panels of "logits whose bits changed" (of `vocab`), numpy's plain product beside the
    runner: left, each of eight sequences alone against in one batch (`batch`: product -> counts);
    right, each way of cutting a prompt against one step (`chunk`: product -> way -> count). A
    zero bar is said in words on the chart."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.4), gridspec_kw={"width_ratios": [8, len(next(iter(chunk.values())))]})
    colors = {"plain": "tab:blue", "invariant": "tab:orange"}
    names = {"plain": "numpy's x @ W.T", "invariant": "the runner"}
    top = max([8] + [v for c in batch.values() for v in c] + [v for c in chunk.values() for v in c.values()]) * 1.2
    for ax, data, title in ((axes[0], batch, "one sequence: alone, then in a batch of 8"),
                            (axes[1], {k: list(v.values()) for k, v in chunk.items()}, "one prompt, cut in pieces")):
        for j, (product, counts) in enumerate(data.items()):
            xs = np.arange(len(counts)) + (j - 0.5) * 0.4
            ax.bar(xs, counts, 0.4, color=colors[product], label=names[product])
            for x, v in zip(xs, counts):
                if v == 0:  # a bar of height 0 is invisible: the chart says it
                    ax.text(x, top * 0.02, "0 bits differ", rotation=90, ha="center", va="bottom", fontsize=7,
                            color=colors[product])
        ax.set_ylim(0, top)
        ax.set_title(title, fontsize=10)
    axes[0].set_xticks(range(8), [f"seq {i}" for i in range(8)])
    axes[0].set_ylabel(f"logits with other bits (of {vocab})")
    ways = list(next(iter(chunk.values())))
    axes[1].set_xticks(range(len(ways)), ways, rotation=20, fontsize=8)
    axes[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ 14_under_the_hood


def bits_grid(grids: dict[str, np.ndarray], rows: list[str], vocab: int):
    """One panel per name of `grids`: (len(rows), batch sizes) counts of logits whose bits differ
    from the row alone, each cell written in."""
    plt = _plt()
    fig, axes = plt.subplots(1, len(grids), figsize=(5.2 * len(grids), 0.55 * len(rows) + 1.6))
    for ax, (name, grid) in zip(np.atleast_1d(axes), grids.items()):
        ax.imshow(grid, cmap="Reds", vmin=0, vmax=vocab, aspect="auto")
        for (i, m), v in np.ndenumerate(grid):
            ax.text(m, i, str(v), ha="center", va="center", fontsize=8)
        ax.set_xticks(range(grid.shape[1]), [str(m) for m in range(1, grid.shape[1] + 1)])
        ax.set_yticks(range(len(rows)), rows, fontsize=8)
        ax.set_xlabel("batch size (sequence 0 last)")
        ax.set_title(f"{name}: logits with other bits (of {vocab})", fontsize=10)
    fig.tight_layout()
    return fig


def speed_bars(bench: dict):
    """Tokens per second from benchmarks/results/smollm2.json: one panel per figure (prefill, decode
    batch 1, decode batch 8), one bar per engine and weights at each thread count."""
    plt = _plt()
    figs = [k for k in ("prefill_tok_s", "decode_b1_tok_s", "decode_b8_tok_s") if k in bench["rows"][0]]
    measured = [r for r in bench["rows"] if r["engine"] in ("tl_lab", "transformers", "llama.cpp")
                and isinstance(r["threads"], int)]
    threads = sorted({r["threads"] for r in measured})
    engines = sorted({(r["engine"], r["weights"]) for r in measured}, key=lambda e: (e[0] != "tl_lab", e[1]))
    fig, axes = plt.subplots(1, len(figs), figsize=(4.2 * len(figs), 3.2))
    width = 0.8 / len(engines)
    for ax, f in zip(np.atleast_1d(axes), figs):
        for j, e in enumerate(engines):
            vals = [next((r.get(f, np.nan) for r in measured if (r["engine"], r["weights"]) == e and r["threads"] == t),
                         np.nan) for t in threads]
            xs = np.arange(len(threads)) + (j - (len(engines) - 1) / 2) * width
            ax.bar(xs, vals, width, label=f"{e[0]} {e[1]}")
            for x, v in zip(xs, vals):
                if v == v:  # not NaN: a figure the engine has
                    ax.text(x, v, f"{v:.0f}", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(threads)), [f"{t} thread{'s' if t > 1 else ''}" for t in threads])
        ax.set_title(f.replace("_tok_s", "").replace("_b", " batch ").replace("_", " "))
        ax.set_ylabel("tokens / s")
        ax.margins(y=0.15)
    np.atleast_1d(axes)[-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.suptitle("SmolLM2-135M, from benchmarks/results/smollm2.json")
    fig.tight_layout()
    return fig


def decode_profile(profile: list[dict]):
    """One batch-1 decode step split into its pieces (the results file's `decode_profile`): one
    stacked bar per weights and thread count, in % of the step."""
    plt = _plt()
    parts = [k for k in profile[0] if k.endswith(" %")]
    fig, ax = plt.subplots(figsize=(9, 0.6 * len(profile) + 1.2))
    left = np.zeros(len(profile))
    for p in parts:
        share = np.array([pr[p] for pr in profile])
        ax.barh(range(len(profile)), share, left=left, label=p[:-2])
        left += share
    ax.set_yticks(range(len(profile)),
                  [f"{pr['weights']}, {pr['threads']} thread(s): {pr['step_ms']:.0f} ms" for pr in profile])
    ax.set_title("where one decode step goes")
    ax.set_xlabel("% of one decode step (batch 1)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------ 00_start_here


def step_map():
    """One call of ModelRunner.forward as a snake of boxes: the top row left to right, the bottom row back;
    one layer (blue) framed, with the loop back to the next layer. -> (fig, boxes, texts)."""
    from matplotlib.patches import FancyBboxPatch, Polygon

    plt = _plt()
    top = ["tokens", "embed", "RMSNorm", "q, k, v", "RoPE at\npos(t)", "write K, V\n(f16) into\nblocks",
           "attention\nover\nj <= pos(t)"]
    bottom = ["o W_o +\nresidual", "RMSNorm", "SwiGLU +\nresidual", "final norm\n(last token)", "LM head", "sample"]
    W_BOX, H_BOX, GAP, Y_TOP = 1.45, 0.95, 0.45, 1.7
    S = W_BOX + GAP
    fig, ax = plt.subplots(figsize=(13, 4.2))
    boxes, texts = [], []

    def box(x, y, label, per_layer):
        patch = FancyBboxPatch((x, y), W_BOX, H_BOX, boxstyle="round,pad=0.02", fc="#cfe3ff" if per_layer else "#eeeeee",
                               ec="0.4")
        ax.add_patch(patch)
        boxes.append(patch)
        texts.append(ax.text(x + W_BOX / 2, y + H_BOX / 2, label, ha="center", va="center", fontsize=9))
        return x, y

    pos_top = [box(i * S, Y_TOP, s, i >= 2) for i, s in enumerate(top)]
    pos_bottom = [box((len(top) - 1 - i) * S, 0, s, i <= 2) for i, s in enumerate(bottom)]
    arrow = dict(arrowstyle="-|>", color="0.25", lw=1.3, mutation_scale=14)
    for (x0, y0), (x1, _) in zip(pos_top, pos_top[1:]):
        ax.annotate("", xy=(x1, y0 + H_BOX / 2), xytext=(x0 + W_BOX, y0 + H_BOX / 2), arrowprops=arrow)
    ax.annotate("", xy=(pos_bottom[0][0] + W_BOX / 2, H_BOX), xytext=(pos_top[-1][0] + W_BOX / 2, Y_TOP), arrowprops=arrow)
    for (x0, y0), (x1, _) in zip(pos_bottom, pos_bottom[1:]):
        ax.annotate("", xy=(x1 + W_BOX, y0 + H_BOX / 2), xytext=(x0, y0 + H_BOX / 2), arrowprops=arrow)
    m, mid = 0.15, (H_BOX + Y_TOP) / 2
    xl_top, xl_bot, xr = pos_top[2][0] - m, pos_bottom[2][0] - m, pos_top[-1][0] + W_BOX + m
    ax.add_patch(Polygon([(xl_top, Y_TOP + H_BOX + m), (xr, Y_TOP + H_BOX + m), (xr, -m), (xl_bot, -m), (xl_bot, mid),
                          (xl_top, mid)], closed=True, fill=False, ls="--", ec="#2471a3"))
    ax.text(xl_top, Y_TOP + H_BOX + m + 0.08, "one layer (blue), repeated num_hidden_layers times", fontsize=9,
            color="#2471a3")
    ax.annotate("", xy=(pos_top[2][0] + W_BOX / 2, Y_TOP), xytext=(pos_bottom[2][0] + W_BOX / 2, H_BOX),
                arrowprops=dict(arrowstyle="-|>", color="#2471a3", lw=1.2, ls=":", mutation_scale=12))
    ax.text((pos_top[2][0] + pos_bottom[2][0]) / 2 + W_BOX / 2, mid, "to the next layer", fontsize=8, color="#2471a3",
            ha="center", va="center", bbox=dict(fc="white", ec="none", pad=1))
    ax.set_xlim(-0.2, len(top) * S)
    ax.set_ylim(-0.4, Y_TOP + H_BOX + 0.5)
    ax.axis("off")
    return fig, boxes, texts


# ------------------------------------------------------------------ 03_numbers


def relative_error(x, rel16, relbf, overflow, floor: float = 1e-9):
    """The relative error of storing each f32 x as f16 (top) and bf16 (bottom), with their bounds, the
    subnormal band, underflow and overflow marked. -> (fig, top axes, the underflow note)."""
    plt = _plt()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    shown16 = np.clip(np.where(overflow, 1.0, rel16), floor, 1.0)  # overflow drawn at 1, like underflow
    for ax, rel, bound, colour, name in ((top, shown16, 2**-11, "tab:blue", "f16"),
                                         (bottom, np.clip(relbf, floor, 1.0), 2**-8, "tab:orange", "bf16")):
        ax.loglog(x[::3], rel[::3], ",", color=colour, alpha=0.5)
        ax.axhline(bound, color="black", ls="--", lw=1)
        ax.text(2e-9, bound * 1.6, f"bound $2^{{{int(np.log2(bound))}}}$", fontsize=9)
        ax.set(ylim=(floor, 3), ylabel=f"{name} relative error\n(exact: drawn at 1e-9)")
    top.axvspan(1e-9, 2**-14, color="tab:blue", alpha=0.08)
    top.text(3e-8, 3e-8, "subnormals:\nfewer bits", fontsize=9)
    note = top.annotate("underflow to 0:\nrelative error 1", xy=(6e-9, 1), xytext=(1.2e-9, 4e-6), fontsize=8,
                        arrowprops=dict(arrowstyle="->", lw=0.8))
    top.axvspan(65520, 1e6, color="red", alpha=0.1)
    top.text(7e4, 3e-8, "overflow:\ninf", fontsize=9)
    bottom.set(xlim=(1e-9, 1e6), xlabel="|x|")
    top.set_title("Relative error of storing an f32 as f16 (top) or bf16 (bottom)")
    return fig, top, note


# ------------------------------------------------------------------ 06_int4


def int4_group(group, W_hat, s_group: float):
    """One group of 32 weights before (W) and after (W_hat = q s) int4, on the 16 levels, and the error
    W - W_hat magnified against +-s/2; legends beside the plots. -> (fig, ax, ax_err)."""
    plt = _plt()
    fig, (ax, ax_err) = plt.subplots(2, 1, figsize=(10, 5.6), sharex=True, height_ratios=(3, 2))
    for level in range(-8, 8):
        ax.axhline(level * s_group, color="0.85", lw=0.8, zorder=0)
    cols = np.arange(len(group))
    ax.vlines(cols, group, W_hat, color="tab:red", lw=5, alpha=0.75, zorder=2, label="$W - \\hat W$")
    ax.plot(cols, group, "o", color="tab:blue", ms=4, zorder=3, label="$W$ (f32)")
    ax.plot(cols, W_hat, "_", color="black", ms=12, mew=2, label="$\\hat W = q\\,s$")
    ax.set(ylabel="weight", title=f"One group of {len(group)}, s = {s_group:.6g} (grey: the 16 levels)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    ax_err.bar(cols, group - W_hat, 0.6, color="tab:red", label="$W - \\hat W$")
    ax_err.axhline(s_group / 2, color="tab:orange", ls="--", label="$\\pm s/2$")
    ax_err.axhline(-s_group / 2, color="tab:orange", ls="--")
    ax_err.axhline(0, color="0.5", lw=0.8)
    ax_err.set(xlabel="column in the group", ylabel="$W - \\hat W$", ylim=(-0.6 * s_group, 0.6 * s_group),
               title="the same error, magnified: never beyond half a level")
    ax_err.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    fig.tight_layout()
    return fig, ax, ax_err


# ------------------------------------------------------------------ 12_where_next


def rtn_vs_gptq(err_rtn, err_gptq, res: dict, n_cal: int, n_test: int, title: str):
    """Left: each weight's |W - W_hat| / s for round-to-nearest and GPTQ, as outlines so neither hides the
    other; right: the layer's output error on calibration and held-out tokens, values written on the bars.
    -> (fig, ax1, ax2)."""
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.2))
    bins = np.linspace(0, max(float(err_rtn.max()), float(err_gptq.max())), 61)
    ax1.hist(err_rtn, bins=bins, histtype="step", lw=1.6, color="tab:blue", label="RTN")
    ax1.hist(err_gptq, bins=bins, histtype="step", lw=1.6, color="tab:orange", label="GPTQ")
    ax1.axvline(0.5, color="tab:red", ls="--", label="s / 2")
    ax1.set(xlabel="|W - W_hat| / s", ylabel="weights", yscale="log", title="error per weight")
    ax1.legend(fontsize=8)
    xs = np.arange(2)
    for i, (name, (cal, test)) in enumerate(res.items()):
        ax2.bar(xs + (i - 0.5) * 0.38, [cal, test], 0.38, label=name, color=("tab:blue", "tab:orange")[i])
        for x, v in zip(xs + (i - 0.5) * 0.38, (cal, test)):
            ax2.text(x, v, f"{v:.4f}", ha="center", va="bottom", fontsize=8)
    ax2.set_xticks(xs, [f"calibration ({n_cal} tokens)", f"held out ({n_test} tokens)"])
    ax2.set(ylabel="||X (W_hat - W)^T|| / ||X W^T||", title="error of the layer's output")
    ax2.set_ylim(0, max(max(v) for v in res.values()) * 1.5)
    ax2.legend(fontsize=8, loc="upper center", ncol=2)
    fig.suptitle(title)
    fig.tight_layout()
    return fig, ax1, ax2


# ------------------------------------------------------------------ 04_kv_pool


def contiguous_vs_blocks(lengths: dict[str, int], max_len: int, tables: dict[str, list[int]], B: int, capacity: int):
    """The same requests in two caches of `capacity` positions: top, one contiguous region of `max_len`
    per request (its tokens coloured, the room it holds for tokens it may never have hatched); bottom,
    blocks of B from one pool, each coloured by the request whose table holds it (a block's unused
    slots lighter), free blocks white."""
    from matplotlib.patches import Rectangle

    plt = _plt()
    colours = dict(zip(lengths, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    fig, ax = plt.subplots(figsize=(11, 2.6))
    for i, (r, n) in enumerate(lengths.items()):
        x0 = i * max_len
        ax.add_patch(Rectangle((x0, 1.2), n, 0.8, color=colours[r]))
        ax.add_patch(Rectangle((x0 + n, 1.2), max_len - n, 0.8, fc="none", ec="0.6", hatch="///", lw=0))
        ax.text(x0 + 1, 1.6, f"{r}: {n}", va="center", fontsize=8, color="white")
    owner = {b: r for r, t in tables.items() for b in t}
    for b in range(capacity // B):
        x0 = b * B
        if b in owner:
            r = owner[b]
            k = tables[r].index(b)
            filled = min(B, lengths[r] - k * B)
            ax.add_patch(Rectangle((x0, 0), filled, 0.8, color=colours[r]))
            ax.add_patch(Rectangle((x0 + filled, 0), B - filled, 0.8, color=colours[r], alpha=0.3))
        ax.add_patch(Rectangle((x0, 0), B, 0.8, fc="none", ec="0.3", lw=0.5))
    ax.set_xlim(0, capacity)
    ax.set_ylim(-0.1, 2.1)
    ax.set_yticks([0.4, 1.6], [f"blocks of {B}", f"contiguous, {max_len} each"])
    ax.set_xlabel("position in the cache's memory (hatched: held, never written; white: free)")
    fig.tight_layout()
    return fig
