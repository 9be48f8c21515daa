"""The checkpoint widget: pick a model directory, see its safetensors file as bytes, its config and size.

Chapter L10.1, section 2.3 (the model directory). Everything shown is read by the real code path:
`tl_lab.model.ModelConfig.load` for config.json and `tl_lab.model.SafeTensors.open` (the
memory-mapped reader, which parses only the header) for model.safetensors. A directory that the
engine refuses shows the refusal's message instead of a map.

    CheckpointView()                     the three bundled checkpoints in a dropdown
    CheckpointView({"mine": path, ...})  any model directories (a broken one shows its refusal)
    file_map_html(path)                  the byte map of one safetensors file, as HTML
"""

from __future__ import annotations

import dataclasses
import html
from dataclasses import dataclass
from pathlib import Path

import ipywidgets as widgets

from tl_lab.errors import TlError, clip
from tl_lab.model import Layout, ModelConfig, SafeTensors
from tl_lab.ops.paths import DATA_DIR
from tl_lab.lab.widgets.common import CellWidget, ERROR, MONO

CHECKPOINTS = {
    "bigram": DATA_DIR / "bigram",
    "tiny Llama (BF16)": DATA_DIR / "tiny-llama",
    "tiny Llama (int4)": DATA_DIR / "tiny-llama-int4",
}
COLOURS = {"length": "#f59e0b", "header": "#a78bfa", "tensor": ["#93c5fd", "#86efac", "#fca5a5", "#fde68a", "#c4b5fd", "#99f6e4"]}
WIDTH, BAR_H, CHAR_W, HEX_BYTES = 900, 34, 6.5, 36


@dataclass(frozen=True)
class Segment:
    """One byte range of the file: [start, end) counted from the start of the FILE."""

    kind: str  # "length" (the u64 N), "header" (the JSON), "tensor"
    name: str
    start: int
    end: int
    dtype: str | None = None
    shape: tuple[int, ...] | None = None

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def file_segments(layout: Layout) -> list[Segment]:
    """The file as byte ranges in order: the 8-byte length, the header, then each tensor.

    Tensor ranges are the header's data_offsets plus data_start (8 + N): the one addition that
    pitfall s11 forgets.
    """
    segs = [Segment("length", "N (u64 LE)", 0, 8), Segment("header", "JSON header", 8, layout.data_start)]
    for name, t in layout.tensors.items():
        a, b = t.data_offsets
        segs.append(Segment("tensor", name, layout.data_start + a, layout.data_start + b, t.dtype, t.shape))
    return segs


def params_in_file(layout: Layout) -> int:
    """Weights stored in the file: elements of each tensor, two per byte of an int4 `.qweight`,
    none for `.scales` (a scale is not a parameter of the model, it is how int4 stores one)."""
    total = 0
    for name, t in layout.tensors.items():
        if name.endswith(".scales"):
            continue
        total += t.numel * (2 if name.endswith(".qweight") else 1)
    return total


def file_map_html(path, title: str | None = None) -> str:
    """The byte map of the safetensors file at `path`, or the reader's refusal, as HTML."""
    path = Path(path)
    try:
        with SafeTensors.open(path) as st:
            layout = st.layout
    except TlError as exc:
        return _refusal(f"{path.name}: {type(exc).__name__}", str(exc))
    return render_map(file_segments(layout), layout, title or path.name, _first_bytes(path))


def _first_bytes(path: Path, n: int = HEX_BYTES) -> bytes:
    with open(path, "rb") as f:
        return f.read(n)


def render_map(segs: list[Segment], layout: Layout, title: str, first: bytes = b"") -> str:
    """Three rows: the whole file to scale, its first 8 + N bytes to scale, and its first bytes one
    by one (the length N in little-endian hex, then the header's first characters); then a table."""
    size, head_end = layout.file_size, layout.data_start
    y1, y2, y3 = 22, 22 + BAR_H + 40, 22 + 2 * (BAR_H + 40)
    rows = [
        f"<text x='10' y='{y1 - 8}'>the whole file, {size:,} bytes, to scale</text>",
        _bar(segs, 0, size, y1, label_all=False),
        f"<text x='10' y='{y2 - 8}'>its first 8 + N = {head_end:,} bytes, to scale: the length and the header</text>",
        _bar([s for s in segs if s.kind != "tensor"], 0, head_end, y2, label_all=True),
    ]
    height = y3
    if first:
        rows.append(_hex_row(first, y3, head_end - 8))
        height = y3 + BAR_H + 30
    svg = (
        f"<svg class='tl-filemap' xmlns='http://www.w3.org/2000/svg' width='{WIDTH + 20}' "
        f"height='{height}' style='font-family: sans-serif; font-size: 11px'>{''.join(rows)}</svg>"
    )
    table_rows = "".join(
        f"<tr><td>{i}</td><td>{_escaped(s.name)}</td><td>{s.dtype or ''}</td>"
        f"<td>{'' if s.shape is None else s.shape}</td>"
        f"<td>{'' if s.kind != 'tensor' else f'[{s.start - head_end}, {s.end - head_end}]'}</td>"
        f"<td>[{s.start}, {s.end})</td><td style='text-align:right'>{s.nbytes:,}</td></tr>"
        for i, s in enumerate(segs)
    )
    table = (
        f"<table style='{MONO}; font-size: 11px'><tr><th>#</th><th>range</th><th>dtype</th><th>shape</th>"
        f"<th>data_offsets</th><th>file bytes</th><th>bytes</th></tr>{table_rows}</table>"
    )
    return f"<div class='tl-filemap-block'><p><b>{html.escape(title)}</b></p>{svg}{table}</div>"


def _hex_row(first: bytes, y: int, N: int) -> str:
    """The first bytes one cell each: 8 bytes of N (little endian: the low byte first), then JSON."""
    cell = WIDTH / HEX_BYTES
    parts = [f"<text x='10' y='{y - 8}'>its first {len(first)} bytes, one by one: N = {N:,} = 0x{N:X} "
             f"as a u64 little endian (low byte first), then the header's JSON text</text>"]
    for i, byte in enumerate(first):
        kind = "length" if i < 8 else "header"
        shown = f"{byte:02X}" if i < 8 else (chr(byte) if 32 <= byte < 127 else f"{byte:02X}")
        x = 10 + i * cell
        parts.append(
            f"<rect class='tl-byte' data-offset='{i}' data-value='{byte}' x='{x:.2f}' y='{y}' "
            f"width='{cell:.2f}' height='{BAR_H}' fill='{COLOURS[kind]}' stroke='#374151' stroke-width='0.3'/>"
            f"<text x='{x + cell / 2:.2f}' y='{y + BAR_H / 2 + 4}' text-anchor='middle' "
            f"style='{MONO}'>{html.escape(shown)}</text>"
        )
    return "".join(parts)


def _bar(segs: list[Segment], lo: int, hi: int, y: int, label_all: bool) -> str:
    """One bar: segment i drawn at x proportional to its start, width to its byte count.

    Labels: the name where it fits, else its number (#i, keyed to the table), else nothing; the
    tooltip always names it.
    """
    scale = WIDTH / max(hi - lo, 1)
    parts = []
    n_tensor = 0
    for i, s in enumerate(segs):
        if s.kind == "tensor":
            colour = COLOURS["tensor"][n_tensor % len(COLOURS["tensor"])]
            n_tensor += 1
        else:
            colour = COLOURS[s.kind]
        x, w = 10 + (s.start - lo) * scale, s.nbytes * scale
        label = f"{clip(s.name, 200)} ({s.nbytes:,} B)" if label_all else f"#{i} {clip(s.name, 200)}"
        for candidate in (label, f"#{i}", ""):
            if CHAR_W * len(candidate) + 4 <= w:
                break
        text = ""
        if candidate:
            text = (f"<text x='{x + w / 2:.2f}' y='{y + BAR_H / 2 + 4}' text-anchor='middle'>"
                    f"{html.escape(candidate)}</text>")
        parts.append(
            f"<g><title>#{i} {_escaped(s.name)}: bytes [{s.start}, {s.end})</title>"
            f"<rect class='tl-seg' data-index='{i}' data-kind='{s.kind}' data-name='{_escaped(s.name)}' "
            f"data-start='{s.start}' data-end='{s.end}' x='{x:.4f}' y='{y}' width='{w:.4f}' "
            f"height='{BAR_H}' fill='{colour}' stroke='#374151' stroke-width='0.3'/>{text}</g>"
        )
    return "".join(parts)


def _refusal(title: str, message: str) -> str:
    return (f"<div class='tl-refusal' style='color:{ERROR}'><b>{html.escape(title)}</b>"
            f"<pre style='white-space: pre-wrap'>{html.escape(message)}</pre></div>")


def config_html(config: ModelConfig, n_file: int | None = None, file_size: int | None = None) -> str:
    """ModelConfig's fields as a table, and the parameter count."""
    rows = "".join(
        f"<tr><td>{f.name}</td><td>{html.escape(_short(getattr(config, f.name)))}</td></tr>"
        for f in dataclasses.fields(config)
    )
    n = config.param_count()
    size = ""
    if file_size is not None:
        size = f"; model.safetensors is {file_size:,} bytes, {file_size / n:.2f} bytes per parameter"
    agree = ""
    if n_file is not None:
        agree = " (the file's tensors hold exactly these)" if n_file == n else f" (but the file holds {n_file:,})"
    return (
        f"<p class='tl-params'>parameters: <b>{n:,}</b>{agree}{size}</p>"
        f"<table style='{MONO}; font-size: 11px'><tr><th>ModelConfig field</th><th>value</th></tr>{rows}</table>"
    )


def _escaped(name: str) -> str:
    """A tensor name for the page: clipped (a name can be 95 MB: the page would be three times that)."""
    return html.escape(clip(name, 200))


def _short(v) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


class CheckpointView(CellWidget):
    """A dropdown of model directories; the file map, the config and the parameter count of the one picked.

    After each change: `path` (the directory), `config` (ModelConfig or None), `file_layout` (the file's
    Layout or None), `segments` (the byte ranges drawn), `param_count` (from config.json),
    `file_params` (counted from the file's tensors), `error` (the refusal message, or None).
    `map` and `info` are the HTML widgets showing them.
    """

    def __init__(self, checkpoints: dict[str, Path] | None = None, value: str | None = None):
        self.checkpoints = dict(CHECKPOINTS if checkpoints is None else checkpoints)
        if not self.checkpoints:
            raise ValueError("CheckpointView needs at least one model directory")
        self.dropdown = widgets.Dropdown(options=list(self.checkpoints), description="checkpoint",
                                         value=value or next(iter(self.checkpoints)))
        self.info = widgets.HTML()
        self.map = widgets.HTML()
        self.path: Path | None = None
        self.config: ModelConfig | None = None
        self.file_layout: Layout | None = None
        self.segments: list[Segment] = []
        self.param_count: int | None = None
        self.file_params: int | None = None
        self.error: str | None = None
        super().__init__([self.dropdown, self.info, self.map])
        self.dropdown.observe(lambda change: self.refresh(), names="value")
        self.refresh()

    def refresh(self) -> None:
        """Read the picked directory through the real loader and redraw."""
        self.path = Path(self.checkpoints[self.dropdown.value])
        self.config = self.file_layout = self.param_count = self.file_params = self.error = None
        self.segments = []
        try:
            self.config = ModelConfig.load(self.path)
            with SafeTensors.open(self.path / "model.safetensors") as st:
                self.file_layout = st.layout
        except (TlError, OSError) as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            self.info.value = _refusal(f"{self.dropdown.value} is refused", self.error)
            self.map.value = ""
            return
        self.segments = file_segments(self.file_layout)
        self.param_count = self.config.param_count()
        self.file_params = params_in_file(self.file_layout)
        self.info.value = config_html(self.config, self.file_params, self.file_layout.file_size)
        self.map.value = render_map(self.segments, self.file_layout, f"{self.path.name}/model.safetensors",
                                    _first_bytes(self.path / "model.safetensors"))

