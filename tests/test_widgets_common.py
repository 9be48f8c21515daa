"""Tests for tl_lab/widgets/common.py: what every widget shares (the tables of a notebook's HTML, the
widgets closed when their cell runs again)."""

import ipywidgets as widgets

from tl_lab.widgets import common
from tl_lab.widgets.common import CellWidget, breakable, left_table


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
    ip.kernel = None  # IPython without a kernel (a terminal)
    assert common._running_cell() is None


def test_breakable_lets_a_long_test_name_wrap():
    assert breakable("tests/test_kv.py::test_a_b") == "tests/<wbr>test_<wbr>kv.py::<wbr>test_<wbr>a_<wbr>b"
