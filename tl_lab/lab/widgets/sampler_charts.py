"""The sampler playground's charts: what each stage of docs/spec/sampling.md shows, then how.

Chapter L10.1, section 2.6. `stage_data` reads a `SampleTrace` (the engine's own code path) into
stage -> {"ids", "values", "kept"}; `render_charts` draws every stage as a column of horizontal bars,
all columns sharing one row per shown id, so one token can be followed across the stages in one look.
"""

from __future__ import annotations

import html

import numpy as np

from tl_lab.sample import SampleTrace, SamplingParams
from tl_lab.lab.widgets.common import hbars_svg, labels_svg, short_label

STAGES = ["penalised logits", "logprobs", "scaled logits q = l / T", "after top-k", "after top-p",
          "min-p: weight w = exp(q - max q)", "final probabilities", "CDF walk"]
MIN_P = "min-p: weight w = exp(q - max q)"


def stage_data(tr: SampleTrace, ids: list[int], params: SamplingParams) -> dict[str, dict]:
    """stage -> {"ids", "values", "kept"} for the shown ids, read from the trace."""
    out = {
        "penalised logits": _series(ids, tr.penalised),
        "logprobs": _series(ids, tr.logprobs),
    }
    if tr.greedy:
        out["final probabilities"] = _on_set(ids, tr.kept, tr.probs)
        return out
    out["scaled logits q = l / T"] = _series(ids, tr.scaled)
    out["after top-k"] = _on_set(ids, tr.top_k, tr.top_k_probs)
    out["after top-p"] = _on_set(ids, tr.top_p, tr.top_p_probs)
    kept_min_p = set(tr.min_p.tolist())
    in_top_p = set(tr.top_p.tolist())
    out[MIN_P] = {
        "ids": ids, "values": [float(tr.weights[i]) if i in in_top_p else 0.0 for i in ids],
        "kept": [i in kept_min_p for i in ids],
    }
    out["final probabilities"] = _on_set(ids, tr.kept, tr.probs)
    out["CDF walk"] = _on_set(ids, tr.kept, tr.cdf)
    return out


def _series(ids, values) -> dict:
    return {"ids": ids, "values": [float(values[i]) for i in ids], "kept": [True] * len(ids)}


def _on_set(ids, kept_ids: np.ndarray, values: np.ndarray) -> dict:
    """Values given over a kept set (aligned with its ascending ids), read at the shown ids (0 if dropped)."""
    kept_ids = np.asarray(kept_ids)
    if kept_ids.size == 0:
        return {"ids": ids, "values": [0.0] * len(ids), "kept": [False] * len(ids)}
    order = np.argsort(kept_ids, kind="stable")  # a search, not a dict: kept sets can hold 49,152 ids
    j = np.minimum(np.searchsorted(kept_ids[order], ids), kept_ids.size - 1)
    found = kept_ids[order][j] == np.asarray(ids)
    at = order[j]
    return {"ids": ids, "values": [float(values[a]) if f else 0.0 for a, f in zip(at.tolist(), found.tolist())],
            "kept": found.tolist()}


def axis_label(i: int, labels: list[str] | None) -> str:
    """Row label: the id, and the token string in quotes with its spaces visible (so ',' and '.' show)."""
    return str(i) if labels is None else f"{i} '{short_label(labels[i], 12)}'"


def render_charts(data: dict, tr: SampleTrace, params: SamplingParams, labels: list[str] | None, ids) -> str:
    """Every stage in `data` as a bar column beside the row labels, then one line of notes per stage."""
    hot = ids.index(tr.token)
    notes = stage_notes(tr, params, labels)
    cols = [labels_svg([axis_label(i, labels) for i in ids], hot, title="id 'token'" if labels else "id")]
    for stage in STAGES:
        if stage not in data:
            continue
        d = data[stage]
        line = tr.u if stage == "CDF walk" else (params.min_p if stage == MIN_P and params.min_p else None)
        names = [axis_label(i, labels) for i in ids]
        cols.append(hbars_svg(stage, d["values"], d["kept"], highlight=hot, names=names,
                              ghosts=[float(tr.logits[i]) for i in ids] if stage == "penalised logits" else None,
                              line=line, line_label="u" if stage == "CDF walk" else "min_p"))
    head = "" if len(ids) == tr.penalised.size else (
        f"<p><i>Showing {len(ids)} of {tr.penalised.size} ids: the largest penalised logits and the token, "
        "in ascending id order (the order of the CDF walk).</i></p>")
    grid = "<div class='tl-stages' style='display:flex; flex-wrap:wrap; gap:2px'>" + "".join(cols) + "</div>"
    items = "<br>".join(f"<b>{html.escape(s)}</b>: {html.escape(n)}" for s, n in notes.items() if n)
    return head + grid + f"<p class='tl-notes' style='font-size:12px; line-height:1.4; margin:4px 0'>{items}</p>"


def stage_notes(tr: SampleTrace, params: SamplingParams, labels: list[str] | None) -> dict[str, str]:
    """stage -> one sentence saying what the column shows for these parameters."""
    if tr.greedy:
        return {"final probabilities": "temperature 0: greedy, the first id with the largest penalised logit; "
                "top-k, top-p and min-p are not evaluated and the generator is not touched"}
    return {
        "penalised logits": "dashed outline: the logit before the penalties",
        "logprobs": "log softmax of the penalised logits, before temperature: the logprob returned",
        "after top-k": f"top_k = {params.top_k}" + (" (off)" if params.top_k == 0 else ""),
        "after top-p": walk_note(tr, params, labels),
        MIN_P: f"kept when w >= min_p = {params.min_p:g}" + (" (off)" if params.min_p == 0 else ""),
        "final probabilities": "softmax over the kept ids, in ascending id order",
        "CDF walk": f"the first kept id with u < c; u = {tr.u:.5f}",
    }


def walk_note(tr: SampleTrace, params: SamplingParams, labels: list[str] | None) -> str:
    """The nucleus walk in rank order, each step named as on the chart's rows."""
    if tr.nucleus_order is None:
        return "top_p = 1 (off)"
    steps = ", ".join(f"{axis_label(i, labels)}: {c:.4f}"
                      for i, c in zip(tr.nucleus_order.tolist()[:8], tr.nucleus_cum.tolist()[:8]))
    more = ", ..." if tr.nucleus_order.size > 8 else ""
    return f"walk (q desc): {steps}{more}; stop at >= {params.top_p:g}"
