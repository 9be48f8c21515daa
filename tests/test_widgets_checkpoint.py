"""Tests for tl_lab/widgets/checkpoint.py: pick checkpoints with the dropdown, check what is shown."""

import html as html_module
import json
import re
import shutil

import pytest

from tl_lab.model import ModelConfig, SafeTensors
from tl_lab.paths import DATA_DIR
from tl_lab.widgets.checkpoint import WIDTH, CheckpointView, file_map_html, params_in_file


def plain(html: str) -> str:
    return " ".join(html_module.unescape(re.sub(r"<[^>]+>", " ", html)).split())


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
    from tl_lab.widgets.checkpoint import file_map_html

    name = "w" * 3_000_000
    header = b'{"%s":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}' % name.encode()
    p = tmp_path / "long.safetensors"
    p.write_bytes(len(header).to_bytes(8, "little") + header + b"\0\0\0\0")
    page = file_map_html(p)
    assert "tl-refusal" not in page and "characters left out" in page
    assert len(page) < 100_000, len(page)
