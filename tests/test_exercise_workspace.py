"""tl_lab/lab/exercise/workspace.py: where the workspace is, and its import hook run in this process (plan,
the finder, install once and first, from the environment, the refusal of the six).
"""

import sys

import pytest

from conftest import workspace
from tl_lab.lab.exercise.registry import MODULES
from tl_lab.lab.exercise.stubs import ExerciseError, reference_source, stub_source
from tl_lab.ops.paths import REPO_ROOT


@pytest.mark.parametrize("value, where", [("off", "default"), (" OFF ", "default"), ("", "default"),
                                          ("0", "default"), ("none", "default"), ("{tmp}/ws", "{tmp}/ws")])
def test_the_workspace_is_the_one_named_else_the_clones(tmp_path, monkeypatch, value, where):
    from tl_lab.lab.exercise import workspace as wsm

    monkeypatch.setenv(wsm.ENV, value.format(tmp=tmp_path))
    expected = wsm.default_workspace() if where == "default" else tmp_path / "ws"
    assert wsm.resolve() == expected
    assert wsm.resolve(tmp_path / "given") == tmp_path / "given"  # an argument wins over the environment
    monkeypatch.delenv(wsm.ENV)
    assert wsm.resolve() == wsm.default_workspace()


def test_the_workspace_is_the_one_the_readme_names_and_git_ignores():
    """The default workspace is work/L10.1 in the clone, as the README tells the learner, and git
    ignores it (pulling an update never touches the learner's files)."""
    from tl_lab.lab.exercise import workspace as wsm

    where = wsm.default_workspace().relative_to(REPO_ROOT).as_posix()
    assert where == "work/L10.1" and f"`{where}/`" in (REPO_ROOT / "README.md").read_text()
    assert "/work/" in (REPO_ROOT / ".gitignore").read_text().split(), ".gitignore does not name /work/"


def test_the_workspace_is_the_one_whose_refusal_is_kept_and_lifted_alone(monkeypatch):
    """A bad TL_LAB_WORKSPACE kept by `import tl_lab` (a RefusingFinder with an ExerciseError) is what
    `env_error` reports, and `lift_refusal` removes it, and only it: a bad TL_LAB_PITFALL's stays."""
    from tl_lab.lab.exercise import workspace as wsm
    from tl_lab.lab.pitfalls import PitfallError
    from tl_lab.lab.switch import RefusingFinder

    ours = RefusingFinder(ExerciseError("TL_LAB_WORKSPACE: no such folder"), lambda name: False)
    theirs = RefusingFinder(PitfallError("TL_LAB_PITFALL: s99 is not a pitfall"), lambda name: False)
    monkeypatch.setattr(sys, "meta_path", [theirs, ours, ours, *sys.meta_path])
    assert wsm.env_error() is ours.error
    wsm.lift_refusal()
    assert ours not in sys.meta_path and theirs in sys.meta_path
    assert wsm.env_error() is None


def _hook_workspace(tmp_path):
    """A workspace of three kinds of file: kv.py the untouched stub, quant.py the learner's (here the
    reference's text), model.py absent, the rest stubs."""
    ws = workspace(tmp_path, modules=[m for m in MODULES if m != "model"])
    (ws / "quant.py").write_text(reference_source("quant"), encoding="utf-8")
    return ws


def test_in_process_hook_plans_each_modules_origin(tmp_path):
    from tl_lab.lab.exercise import workspace as wsm

    ws = _hook_workspace(tmp_path)
    got = wsm.plan(ws)
    assert (got["quant"].origin, got["quant"].file, got["quant"].why) == ("learner", str(ws / "quant.py"),
                                                                         "the learner's file")
    assert (got["kv"].origin, got["kv"].why) == ("reference", "untouched since start (the stub)")
    assert (got["model"].origin, got["model"].why) == ("reference", "no model.py in the workspace")
    assert got["model"].file == str(wsm.reference_path("model")) == got["kv"].file.replace("kv.py", "model.py")
    asked = wsm.plan(ws, use={"kv"})  # asked for by name: the stub is the learner's now
    assert asked["kv"].origin == "learner" and asked["quant"].why == "the reference stands in (not asked for)"
    instead = wsm.plan(ws, instead={"quant": "its tests fail"})
    assert (instead["quant"].origin, instead["quant"].why) == ("reference", "its tests fail")
    finder = wsm.WorkspaceFinder(ws, got)
    assert set(finder.served) == {"tl_lab.quant"} and finder.served["tl_lab.quant"][1] == reference_source("quant")
    assert finder.workspace == ws and finder.origins is got


def test_in_process_hook_refuses_a_file_that_is_not_utf8_at_its_import_alone(tmp_path):
    """kv.py saved in Latin-1: planned as the learner's (it is not the stub), and importing it raises a
    SyntaxError naming its file and line; the other learner files are served all the same."""
    from tl_lab.lab.exercise import workspace as wsm

    ws = _hook_workspace(tmp_path)
    text = reference_source("kv") + "\n# café\n"
    (ws / "kv.py").write_bytes(text.encode("latin-1"))
    line = text.count("\n")
    with pytest.raises(wsm.NotUtf8Error) as bad:
        wsm.read_source(ws / "kv.py")
    assert isinstance(bad.value, SyntaxError) and (bad.value.filename, bad.value.lineno, bad.value.msg) == (
        str(ws / "kv.py"), line, "not UTF-8 text (invalid continuation byte)")
    got = wsm.plan(ws)
    assert (got["kv"].origin, got["quant"].origin) == ("learner", "learner")
    finder = wsm.WorkspaceFinder(ws, got)
    assert set(finder.served) == {"tl_lab.quant"} and finder.find_spec("tl_lab.quant").origin == str(ws / "quant.py")
    for _ in range(2):  # each import raises anew
        with pytest.raises(wsm.NotUtf8Error) as again:
            finder.find_spec("tl_lab.kv")
        assert (again.value.filename, again.value.lineno, again.value.msg) == (
            bad.value.filename, bad.value.lineno, bad.value.msg)
    (ws / "quant.py").write_text("x = 1\r\ny = 2\r", encoding="utf-8", newline="")
    assert wsm.read_source(ws / "quant.py") == (ws / "quant.py").read_text(encoding="utf-8") == "x = 1\ny = 2\n"


def test_in_process_hook_reads_a_byte_order_mark_and_counts_any_line_ending(tmp_path):
    """A UTF-8 file with a byte order mark (older Windows Notepad saves one) is its text, as Python's import
    reads it (was: "invalid non-printable character U+FEFF" at its compile); the stub so saved, or with CRLF
    or CR lines, is still the stub; a bad byte's line counts "\\r\\n", "\\r" and "\\n" as the text's newlines do
    (was: "\\n" alone, so a file with CR lines always said line 1), with or without the mark."""
    import codecs

    from tl_lab.lab.exercise import workspace as wsm

    bom = codecs.BOM_UTF8
    ws = _hook_workspace(tmp_path)
    (ws / "quant.py").write_bytes(bom + reference_source("quant").replace("\n", "\r\n").encode())
    assert wsm.read_source(ws / "quant.py") == reference_source("quant")
    finder = wsm.WorkspaceFinder(ws, wsm.plan(ws))
    spec = finder.find_spec("tl_lab.quant")
    assert spec.origin == str(ws / "quant.py") and spec.loader.get_code("tl_lab.quant").co_filename == spec.origin
    stub = stub_source("kv")
    for data in (bom + stub.encode(), stub.replace("\n", "\r\n").encode(), bom + stub.replace("\n", "\r").encode()):
        (ws / "kv.py").write_bytes(data)
        assert wsm.is_stub(ws / "kv.py", "kv") and wsm.plan(ws)["kv"].why == "untouched since start (the stub)"
    lines = ["x = 1", "", "", "\xe9 = 1", "y = 2"]  # the bad byte right after three line breaks, on line 4
    for newline in ("\n", "\r\n", "\r"):
        for mark in (b"", bom):
            (ws / "kv.py").write_bytes(mark + newline.join(lines).encode("latin-1"))
            with pytest.raises(wsm.NotUtf8Error) as bad:
                wsm.read_source(ws / "kv.py")
            assert (bad.value.lineno, bad.value.msg) == (4, "not UTF-8 text (invalid continuation byte)"), (newline, mark)
            assert not wsm.is_stub(ws / "kv.py", "kv")


def test_in_process_hook_installs_once_first_on_the_path(tmp_path, monkeypatch):
    from tl_lab.lab.exercise import workspace as wsm

    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    ws = _hook_workspace(tmp_path)
    import tl_lab.quant  # noqa: F401  (the reference, already imported here)

    with pytest.raises(ExerciseError, match=r"^(tl_lab\.\w+, )*tl_lab\.quant(, tl_lab\.\w+)* already imported "
                                            r"from the reference: activate"):
        wsm.install(ws)
    assert wsm.active() is None  # refused whole: nothing installed
    finder = wsm.install(ws, use=set())  # nothing from the learner: the modules already imported do not matter
    assert sys.meta_path[0] is finder and wsm.active() is finder
    assert {o.origin for o in finder.origins.values()} == {"reference"}
    assert wsm.install(str(ws), use=set()) is finder  # the same workspace again: the same hook
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(ExerciseError, match=f"workspace {ws} is already active in this process"):
        wsm.install(other, use=set())


@pytest.mark.parametrize("value", ["off", "", " NONE ", None])  # None: unset
def test_in_process_hook_from_the_environment_off_installs_nothing(monkeypatch, value):
    from tl_lab.lab.exercise import workspace as wsm

    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    if value is None:
        monkeypatch.delenv(wsm.ENV, raising=False)
    else:
        monkeypatch.setenv(wsm.ENV, value)
    assert wsm.install_from_env() is None and wsm.active() is None


def test_in_process_hook_from_the_environment_takes_the_modules_named(tmp_path, monkeypatch):
    from tl_lab.lab.exercise import workspace as wsm

    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    ws = _hook_workspace(tmp_path)
    import tl_lab.kv  # noqa: F401  (the reference, imported here whatever ran before)
    import tl_lab.quant  # noqa: F401

    monkeypatch.setenv(wsm.ENV, str(ws))
    monkeypatch.setenv(wsm.ENV_USE, " , ")  # no module named: the reference for all six
    finder = wsm.install_from_env()
    assert finder.workspace == ws and {o.origin for o in finder.origins.values()} == {"reference"}
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if f is not finder])
    monkeypatch.setenv(wsm.ENV_USE, "kv, quant")
    with pytest.raises(ExerciseError, match="already imported from the reference"):  # both named, both imported
        wsm.install_from_env()
    monkeypatch.delenv(wsm.ENV_USE)
    with pytest.raises(ExerciseError, match=r"^tl_lab\.\w+(, tl_lab\.\w+)* already imported"):  # quant differs
        wsm.install_from_env()


def test_in_process_hook_refuses_the_six_after_a_bad_environment(monkeypatch):
    from tl_lab.lab.exercise import workspace as wsm

    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.setenv(wsm.ENV, "/no/such/folder")
    wsm.refuse_from_env(ExerciseError("workspace /no/such/folder does not exist"))
    finder = sys.meta_path[0]
    assert wsm.env_error() is finder.error
    assert str(finder.error) == "TL_LAB_WORKSPACE=/no/such/folder: workspace /no/such/folder does not exist"
    for module in MODULES:
        with pytest.raises(ExerciseError, match="^TL_LAB_WORKSPACE=/no/such/folder: "):
            finder.find_spec(f"tl_lab.{module}")
    for other in ("tl_lab.ops.lanes", "tl_lab", "kv", "tl_lab.kv_extra", "tl_lab.lab.widgets.kv"):
        assert finder.find_spec(other) is None, other


def test_in_process_hook_refusal_of_a_relative_path_says_where_it_was_taken_from(monkeypatch, tmp_path):
    """TL_LAB_WORKSPACE=work/L10.1 exported in the clone: a notebook's kernel starts in notebooks/, where
    that folder does not exist; the refusal says the path was taken from there and to give it in full."""
    from tl_lab.lab.exercise import workspace as wsm

    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(wsm.ENV, "work/L10.1")
    wsm.refuse_from_env(ExerciseError(f"workspace {tmp_path / 'work/L10.1'} does not exist"))
    assert str(wsm.env_error()) == (f"TL_LAB_WORKSPACE=work/L10.1: workspace {tmp_path / 'work/L10.1'} does not exist "
                                    f"(a relative TL_LAB_WORKSPACE is taken from the current folder, {tmp_path}: "
                                    "name the workspace by its full path)")


def test_in_process_hook_refusal_of_a_relative_path_that_exists_does_not_blame_the_folder(monkeypatch, tmp_path):
    """A relative TL_LAB_WORKSPACE that was found but cannot be used (a file, say): a full path would
    not help, so the refusal says only what is wrong."""
    from tl_lab.lab.exercise import workspace as wsm

    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ws").write_text("")
    monkeypatch.setenv(wsm.ENV, "ws")
    wsm.refuse_from_env(ExerciseError(f"workspace {tmp_path / 'ws'} is not a directory"))
    assert str(wsm.env_error()) == f"TL_LAB_WORKSPACE=ws: workspace {tmp_path / 'ws'} is not a directory"
