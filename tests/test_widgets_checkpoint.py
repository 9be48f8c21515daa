"""Tests for tl_lab/lab/widgets/checkpoint.py: pick checkpoints with the dropdown, check what is shown."""

import html as html_module
import json
import re
import shutil

import pytest

from conftest import shown_text as plain
from tl_lab.model import ModelConfig, SafeTensors
from tl_lab.ops.paths import DATA_DIR
from tl_lab.lab.widgets.checkpoint import (
    BAR_H, CHAR_W, CHECKPOINTS, WIDTH, CheckpointView, file_map_html, file_segments, params_in_file, render_map,
)


def drawn_segments(svg: str) -> list[dict]:
    """The first bar's rectangles (the whole file): index, kind, name, start, end, x, width."""
    pat = (r"<rect class='tl-seg' data-index='(\d+)' data-kind='(\w+)' data-name='([^']*)' "
           r"data-start='(\d+)' data-end='(\d+)' x='([\d.]+)' y='(\d+)' width='([\d.]+)'")
    rows = [dict(i=int(i), kind=k, name=html_module.unescape(n), start=int(a), end=int(b), x=float(x), y=int(y), w=float(w))
            for i, k, n, a, b, x, y, w in re.findall(pat, svg)]
    first_y = min(r["y"] for r in rows)
    return [r for r in rows if r["y"] == first_y]


def drawn_bytes(svg: str) -> list[int]:
    return [int(v) for _, v in re.findall(r"<rect class='tl-byte' data-offset='(\d+)' data-value='(\d+)'", svg)]


def test_dropdown_shows_each_checkpoint_to_scale():
    view = CheckpointView()
    assert list(view.dropdown.options) == ["bigram", "tiny Llama (BF16)", "tiny Llama (int4)"]
    seen = {}
    for name in view.dropdown.options:
        view.dropdown.value = name
        assert view.error is None
        layout = view.file_layout
        with SafeTensors.open(view.path / "model.safetensors") as f:
            assert layout == f.layout  # the real reader's layout, not a copy
        segs = drawn_segments(view.map.value)
        assert [s["kind"] for s in segs[:2]] == ["length", "header"]
        assert [s["name"] for s in segs[2:]] == list(layout.tensors)
        # to scale: contiguous, widths proportional to bytes, covering the whole bar
        assert segs[0]["start"] == 0 and segs[-1]["end"] == layout.file_size
        for a, b in zip(segs, segs[1:]):
            assert a["end"] == b["start"] and b["x"] == pytest.approx(a["x"] + a["w"], abs=1e-3)
        for s in segs:
            assert s["w"] == pytest.approx(WIDTH * (s["end"] - s["start"]) / layout.file_size, abs=1e-3)
        # the first bytes, one by one: N little endian, then the header's "{"
        first = drawn_bytes(view.map.value)
        assert int.from_bytes(bytes(first[:8]), "little") == layout.data_start - 8 and first[8] == ord("{")
        text = plain(view.info.value)
        assert f"parameters: {view.param_count:,}" in text and "the file's tensors hold exactly these" in text
        assert view.param_count == ModelConfig.load(view.path).param_count() == view.file_params
        seen[name] = (view.param_count, layout.file_size, text)
    assert seen["bigram"][0] == 256 * 256
    assert seen["tiny Llama (BF16)"][0] == seen["tiny Llama (int4)"][0] == 90_432
    assert seen["tiny Llama (int4)"][1] < seen["tiny Llama (BF16)"][1] < seen["bigram"][1]
    assert "'int4-g32-sym'" in seen["tiny Llama (int4)"][2] and "'bigram'" in seen["bigram"][2]
    assert "2.02 bytes per parameter" in seen["tiny Llama (BF16)"][2]


def test_a_refused_checkpoint_shows_its_message(tmp_path):
    truncated = tmp_path / "truncated"
    shutil.copytree(DATA_DIR / "bigram", truncated)
    blob = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(blob[:-100])
    scaled = tmp_path / "scaled"
    shutil.copytree(DATA_DIR / "tiny-llama", scaled)
    cfg = json.loads((scaled / "config.json").read_text())
    cfg["rope_scaling"] = {"rope_type": "llama3", "factor": 32.0}
    (scaled / "config.json").write_text(json.dumps(cfg))
    view = CheckpointView({"good": DATA_DIR / "bigram", "truncated": truncated, "scaled": scaled,
                           "missing": tmp_path / "nowhere"})
    view.dropdown.value = "truncated"
    assert view.error.startswith("FormatError") and "truncated" in view.error
    assert "tl-refusal" in view.info.value and "truncated is refused" in plain(view.info.value)
    assert view.map.value == "" and view.segments == [] and view.param_count is None
    view.dropdown.value = "scaled"
    assert view.error.startswith("ConfigError") and "rope_scaling.rope_type" in view.error
    assert '"llama3"' in plain(view.info.value)
    view.dropdown.value = "missing"
    assert view.error.startswith("ConfigError") and "no such file" in view.error
    view.dropdown.value = "good"
    assert view.error is None and view.param_count == 65536 and drawn_segments(view.map.value)


def test_file_map_html_and_params_in_file(tmp_path):
    page = file_map_html(DATA_DIR / "tiny-llama" / "model.safetensors")
    assert "model.embed_tokens.weight" in plain(page) and "BF16" in page
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00")
    assert "FormatError" in file_map_html(bad) and "shorter" in file_map_html(bad)
    with SafeTensors.open(DATA_DIR / "tiny-llama-int4" / "model.safetensors") as f:
        assert params_in_file(f.layout) == 90_432  # two weights per qweight byte, scales not counted
    with pytest.raises(ValueError):
        CheckpointView({})


def test_a_tensor_name_of_megabytes_makes_a_page_of_kilobytes(tmp_path):
    """Issue 20: a 95 MB tensor name made 285 MB of HTML (the name in the table, a title and an
    attribute). Names are clipped on the page; the file is valid, so the map is drawn."""
    from tl_lab.lab.widgets.checkpoint import file_map_html

    name = "w" * 3_000_000
    header = b'{"%s":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}' % name.encode()
    p = tmp_path / "long.safetensors"
    p.write_bytes(len(header).to_bytes(8, "little") + header + b"\0\0\0\0")
    page = file_map_html(p)
    assert "tl-refusal" not in page and "characters left out" in page
    assert len(page) < 100_000, len(page)


def labelled_segments(svg: str) -> list[dict]:
    """Every segment of both bars that has a label: its rectangle (x, y, w) and its text (tx, ty, text)."""
    pat = (r"<rect class='tl-seg'[^>]* x='([\d.]+)' y='(\d+)' width='([\d.]+)'[^>]*/>"
           r"<text x='([-\d.]+)' y='([-\d.]+)' text-anchor='middle'>([^<]*)</text>")
    return [dict(x=float(x), y=int(y), w=float(w), tx=float(tx), ty=float(ty), text=html_module.unescape(t))
            for x, y, w, tx, ty, t in re.findall(pat, svg)]


def byte_cells(svg: str) -> list[tuple[float, float, float, str]]:
    """The row of first bytes: (x, width, the text's x, the text) per byte."""
    pat = (r"<rect class='tl-byte'[^>]* x='([\d.]+)' y='\d+' width='([\d.]+)'[^>]*/>"
           r"<text x='([\d.]+)'[^>]*>([^<]*)</text>")
    return [(float(x), float(w), float(tx), html_module.unescape(t)) for x, w, tx, t in re.findall(pat, svg)]


@pytest.mark.parametrize("name", list(CHECKPOINTS))
def test_each_label_sits_inside_its_segment_and_fits_it(name):
    """A label names the segment it is drawn on: centred in it, and no longer than it (the tiny
    Llama's narrow segments are within a few pixels of their '#i', so a label too long would show)."""
    labelled = labelled_segments(CheckpointView(value=name).map.value)
    assert labelled
    for s in labelled:
        assert s["x"] <= s["tx"] <= s["x"] + s["w"] and s["y"] <= s["ty"] <= s["y"] + BAR_H, s
        assert CHAR_W * len(s["text"]) + 4 <= s["w"], s


def test_the_rows_are_stacked_each_under_its_caption():
    """The whole file, its header and its first bytes: three rows top to bottom, each caption above its
    row and under the row before, all inside the drawing."""
    page = CheckpointView(value="bigram").map.value
    captions = [int(y) for y in re.findall(r"<text x='10' y='(\d+)'>", page)]
    tops = sorted({int(y) for y in re.findall(r"<rect class='tl-(?:seg|byte)'[^>]* y='(\d+)'", page)})
    height = int(re.search(r"<svg class='tl-filemap'[^>]* height='(\d+)'", page).group(1))
    assert len(captions) == len(tops) == 3
    for k, (caption, top) in enumerate(zip(captions, tops)):
        assert caption < top and (k == 0 or tops[k - 1] + BAR_H < caption - 10), (captions, tops)
    assert tops[-1] + BAR_H <= height


def test_the_first_bytes_show_the_length_in_hex_then_the_header_as_text():
    """The int4 tiny Llama's header is 3,432 = 0xD68 bytes: its first byte 0x68 is the letter h, shown
    as 68 all the same (it is a byte of N); the header's own bytes show as the JSON's characters."""
    view = CheckpointView(value="tiny Llama (int4)")
    first = (view.path / "model.safetensors").read_bytes()[:36]
    cells = byte_cells(view.map.value)
    assert [t for *_, t in cells] == [f"{b:02X}" for b in first[:8]] + list(first[8:].decode())
    assert cells[0][3] == "68" and first[0] == ord("h")
    for (x, w, tx, _), (x_next, *_) in zip(cells, cells[1:]):
        assert x < tx < x + w and x_next == pytest.approx(x + w, abs=0.01)  # one byte after the other
    assert "N = 3,432 = 0xD68 as a u64 little endian" in plain(view.map.value)


def test_the_table_gives_each_tensors_data_offsets_and_file_bytes():
    view = CheckpointView(value="tiny Llama (BF16)")
    rows = re.findall(r"<tr><td>(\d+)</td><td>([^<]*)</td>(?:<td>[^<]*</td>){2}<td>([^<]*)</td><td>([^<]*)</td>",
                      view.map.value)
    tensors, start = view.file_layout.tensors, view.file_layout.data_start
    assert [name for _, name, _, _ in rows] == ["N (u64 LE)", "JSON header", *tensors]
    assert [offsets for _, _, offsets, _ in rows[:2]] == ["", ""]
    for _, name, offsets, file_bytes in rows[2:]:
        a, b = tensors[name].data_offsets
        assert offsets == f"[{a}, {b}]" and file_bytes == f"[{start + a}, {start + b})"


def test_file_map_html_draws_the_first_bytes_and_render_map_only_when_given():
    path = DATA_DIR / "bigram" / "model.safetensors"
    assert drawn_bytes(file_map_html(path)) == list(path.read_bytes()[:36])
    with SafeTensors.open(path) as f:
        layout = f.layout
    assert drawn_bytes(render_map(file_segments(layout), layout, "bigram")) == []
