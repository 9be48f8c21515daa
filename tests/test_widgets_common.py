"""Tests for tl_lab/lab/widgets/common.py: what every widget shares (the tables of a notebook's HTML, the
widgets closed when their cell runs again)."""

import ipywidgets as widgets

from tl_lab.lab.widgets import common
from tl_lab.lab.widgets.common import CellWidget, breakable, left_table


def open_widgets() -> set:
    """The model ids of every widget ipywidgets keeps alive."""
    from ipywidgets.widgets.widget import _instances

    return set(_instances)


def test_a_cell_run_again_closes_the_widgets_its_last_run_made(monkeypatch):
    """Each Run All made a new block map and left the old one (and its copy of a pool) alive: ipywidgets
    keeps a widget until it is closed. A cell that runs again now closes what it made before, children
    included (their observers hold the box); another cell's widgets stay (issue 19)."""
    running = {"cell": ("cell A", 1)}
    monkeypatch.setattr(common, "_running_cell", lambda: running["cell"])
    first = CellWidget([widgets.HBox([widgets.Button()])])
    first.hidden = widgets.Dropdown(options=[1, 2])  # a control kept but not shown: its observer holds the box
    first.hidden.observe(lambda _: first, names="value")
    inner = first.children[0].children[0]
    closed = {first.model_id, first.children[0].model_id, inner.model_id, inner.layout.model_id,
              first.hidden.model_id, first.hidden.style.model_id}
    running["cell"] = ("cell B", 2)
    other = CellWidget([widgets.Button()])
    running["cell"] = ("cell A", 3)           # cell A once more
    again = CellWidget([widgets.Button()])
    also = CellWidget()                       # a second widget of the same run: both stay
    assert first.comm is None and inner.comm is None and first.hidden.comm is None
    assert all(w.comm is not None for w in (other, again, also))
    live = open_widgets()
    assert not closed & live and {other.model_id, again.model_id, also.model_id} <= live


def test_a_cell_run_again_drops_its_closed_widgets_from_the_output_history(monkeypatch):
    """A cell ending in its widget (`pg_big`) left it in IPython's Out[n] and _n, and with it what it
    holds: 07 kept each run's playgrounds, 49,152 labels and their stage arrays (about 20 MB a Run All).
    The closed widget goes from the history; other outputs stay."""
    import types

    import IPython

    running = {"cell": ("cell A", 1)}
    monkeypatch.setattr(common, "_running_cell", lambda: running["cell"])
    first = CellWidget()
    ns = {"Out": {1: first, 2: "other"}, "_1": first, "_2": "other", "_": first, "__": "other"}
    hidden = {"_1": first, "_2": "other", "_": first, "__": "other"}  # the displayhook pushes to both
    hook = types.SimpleNamespace(_=first, __=first, ___="other")  # the displayhook's own copies, pushed again later
    monkeypatch.setattr(IPython, "get_ipython",
                        lambda: types.SimpleNamespace(user_ns=ns, user_ns_hidden=hidden, displayhook=hook))
    running["cell"] = ("cell A", 3)
    again = CellWidget()
    assert first.comm is None and again.comm is not None
    assert ns == {"Out": {2: "other"}, "_2": "other", "_": "", "__": "other"}
    assert hidden == {"_2": "other", "_": "", "__": "other"}
    assert (hook._, hook.__, hook.___) == ("", "", "other")


def test_outside_a_notebook_cell_nothing_is_closed():
    """A script or a test makes as many widgets as it likes: none is closed behind its back."""
    assert common._running_cell() is None
    a, b = CellWidget(), CellWidget()
    assert a.comm is not None and b.comm is not None


def test_left_table_aligns_every_cell_left_and_escapes_its_header():
    """JupyterLab aligns rendered table cells right (10_pitfalls' tables of sentences read ragged)."""
    html = left_table(["id", "a < b"], [["s01", "<code>x</code>"]])
    assert html.count("text-align:left") == 4 and "a &lt; b" in html and "<code>x</code>" in html
    cell = "text-align:left; vertical-align:top; padding:2px 10px"
    assert left_table(["h1", "h2"], [["a", "b"], ["c", "d"]]) == (
        f"<table class='tl-table'><tr><th style='{cell}'>h1</th><th style='{cell}'>h2</th></tr>"
        f"<tr><td style='{cell}'>a</td><td style='{cell}'>b</td></tr><tr><td style='{cell}'>c</td><td style='{cell}'>d</td></tr></table>")


def test_the_running_cell_is_the_execute_requests_cell_id_else_its_code(monkeypatch):
    """What `_one_per_cell` keys a widget by: the front end's cell id (JupyterLab sends it in the
    request's metadata), else the cell's source (nbclient sends none), with this run's count."""
    import types

    import IPython

    parent = {}
    kernel = types.SimpleNamespace(get_parent=lambda: parent)
    ip = types.SimpleNamespace(kernel=kernel, execution_count=7)
    monkeypatch.setattr(IPython, "get_ipython", lambda: ip)
    parent.update(header={"msg_type": "execute_request"}, metadata={"cellId": "c-1"}, content={"code": "x = 1"})
    assert common._running_cell() == ("c-1", 7)
    parent["metadata"] = {}
    assert common._running_cell() == ("x = 1", 7)
    parent["content"] = {"code": ""}
    assert common._running_cell() is None  # nothing to know the cell by
    parent.update(header={"msg_type": "comm_msg"}, content={"code": "x = 1"})  # a widget's callback
    assert common._running_cell() is None
    parent.pop("header")  # a kernel with no parent message yet
    assert common._running_cell() is None
    ip.kernel = None  # IPython without a kernel (a terminal)
    assert common._running_cell() is None


def test_breakable_lets_a_long_test_name_wrap():
    assert breakable("tests/test_kv.py::test_a_b") == "tests/<wbr>test_<wbr>kv.py::<wbr>test_<wbr>a_<wbr>b"


def test_wrap_and_short_label_keep_every_word_and_mark_a_cut():
    assert common.wrap("top k then top p", 8) == ["top k", "then top", "p"]
    assert common.wrap("a verylongword b", 4) == ["a", "verylongword", "b"]  # a longer word on its own line
    assert common.wrap("", 5) == [] and common.wrap("one", 5) == ["one"]
    assert common.short_label(" the", 4) == "␣the" and common.short_label(" there", 4) == "␣th…"
    assert common.short_label("a\nb", 9) == "a\\nb"  # a control character escaped


def test_the_bars_are_drawn_inside_their_pictures_in_their_colours():
    """Kept bars in KEPT, the highlighted one in HIGHLIGHT, a dropped one a grey cross; a ghost outline
    from 0 to the earlier value; the labels' text right-aligned inside their own picture."""
    import re

    from conftest import svg_outside

    svg = common.hbars_svg("probabilities after top-k", [0.5, -0.25, 0.2], [True, True, False], highlight=1,
                           names=["a", "b", "c"], ghosts=[0.75, -0.25, 0.2], line=0.3, line_label="u")
    assert svg.startswith("<svg class='tl-chart'") and svg.endswith("</svg>") and svg.count("</svg>") == 1
    fills = re.findall(r"<rect x='[\d.]+' y='\d+' width='[\d.]+' height='12' fill='([^']+)'><title>(\w)", svg)
    assert fills == [(common.KEPT, "a"), (common.HIGHLIGHT, "b")]
    assert "&#x2715;<title>c: dropped</title>" in svg
    ghost = re.search(r"<rect x='([\d.]+)' y='\d+' width='([\d.]+)' height='12' fill='none'", svg)
    zero = re.search(r"<line x1='([\d.]+)'", svg).group(1)  # the axis at 0, drawn first
    assert ghost.group(1) == zero and float(ghost.group(2)) > 0  # from 0 to the earlier 0.75
    bars = re.findall(r"<rect x='([\d.]+)' y='\d+' width='([\d.]+)' height='12' fill='[^']+'><title>", svg)
    (a_x, a_width), (b_x, b_width) = [(float(x), float(w)) for x, w in bars]
    assert a_x == float(zero) and abs(b_x + b_width - float(zero)) <= 0.1  # each bar from 0 to its value
    assert abs(a_width / float(ghost.group(2)) - 0.5 / 0.75) < 0.01  # as long as its value, to scale
    assert svg.count("fill='none'") == 1  # an unchanged value has no ghost
    line = re.findall(r"<line x1='([\d.]+)' x2='[\d.]+' y1='(\d+)'", svg)
    assert [int(y) for _, y in line] == [common.HEAD_H - 2, common.HEAD_H - 4]  # the axis, then u's line
    title = re.findall(r"<text x='4' y='(\d+)' font-size='10' font-weight='bold'>", svg)
    assert [int(y) for y in title] == [12, 24, 36][: len(title)] and len(title) >= 2  # wrapped, 12 px apart
    assert svg_outside(svg) == []
    labels = common.labels_svg(["a", "longer"], 1, title="token")
    assert svg_outside(labels) == [] and labels.endswith("</svg>")
    width = int(re.search(r"width='(\d+)'", labels).group(1))
    assert re.findall(r"<text x='(\d+)'", labels) == [str(width - 6)] * 3  # every label ends 6 px inside


def test_the_sliders_step_as_their_table_says_and_update_on_release():
    """A float slider moves in its row's step (ipywidgets' own is 0.1), and every slider recomputes once
    it is let go, not at each pixel of a drag (a sampler's charts are redrawn at each change)."""
    table = [common.Control("top_k", widgets.IntSlider, 0, 50, 1, "top-k"),
             common.Control("top_p", widgets.FloatSlider, 0.0, 1.0, 0.01, "top-p")]
    controls = common.build_controls(table, {"top_k": 5, "top_p": 0.9})
    assert controls["top_p"].step == 0.01 and (controls["top_k"].value, controls["top_p"].value) == (5, 0.9)
    assert [c.continuous_update for c in controls.values()] == [False, False]


def test_a_field_lines_up_with_the_sliders_label_column():
    """A text box or dropdown given field_style has the sliders' label width and their width, so the
    labels of a widget's fields and sliders form one column."""
    (slider,) = common.build_controls([common.Control("t", widgets.FloatSlider, 0.0, 2.0, 0.05, "temperature")],
                                      {"t": 1.0}).values()
    box = widgets.Text(**common.field_style())
    assert box.style.description_width == slider.style.description_width == "190px"
    assert box.layout.width == slider.layout.width == "470px"
