"""tl_lab/ops/paths.py: where the bundled data and the model cache are, and how a file is opened (regular
files only, promptly, within a size)."""

import errno
import os
import threading
from pathlib import Path

import pytest

from tl_lab.ops import paths
from tl_lab.errors import ConfigError, FormatError, KvError


def test_the_shipped_folder_is_the_packages_own_when_installed_else_the_checkouts(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "PACKAGE_DIR", tmp_path)
    assert paths._shipped("_data", tmp_path / "checkout") == tmp_path / "checkout"  # a checkout: nothing copied
    (tmp_path / "_data").mkdir()
    assert paths._shipped("_data", tmp_path / "checkout") == tmp_path / "_data"  # an installed copy


def test_the_cache_is_tl_lab_cache_else_xdg_else_the_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TL_LAB_CACHE", "~/models")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert paths.cache_dir() == tmp_path / "home" / "models"  # its ~ expanded
    monkeypatch.setenv("TL_LAB_CACHE", "")  # set but empty: as if unset
    assert paths.cache_dir() == tmp_path / "xdg" / "tl_lab"
    monkeypatch.delenv("TL_LAB_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    assert paths.cache_dir() == tmp_path / "home" / ".cache" / "tl_lab"


def test_a_user_that_does_not_exist_is_a_config_error_naming_where_it_came_from(monkeypatch):
    with pytest.raises(ConfigError) as e:
        paths.expand_user("~no_such_user_tl_lab/models", "--model-dir")
    assert str(e.value).startswith("--model-dir ~no_such_user_tl_lab/models: cannot expand '~no_such_user_tl_lab'")
    assert paths.expand_user("plain/path", "x") == Path("plain/path")
    monkeypatch.setenv("TL_LAB_CACHE", "~no_such_user_tl_lab/c")
    with pytest.raises(ConfigError, match=r"^TL_LAB_CACHE ~no_such_user_tl_lab/c: cannot expand"):
        paths.cache_dir()


def test_a_regular_file_is_opened_and_read_whole(tmp_path):
    f = tmp_path / "f.bin"
    f.write_bytes(b"abc" * 1000)
    with paths.open_regular(f, "the file", FormatError) as opened:
        assert opened.read() == b"abc" * 1000
    assert paths.read_regular(f, "the file", FormatError, limit=3000) == b"abc" * 1000  # exactly the limit


def test_what_is_not_a_regular_file_is_refused_by_name_and_kind(tmp_path):
    with pytest.raises(ConfigError, match=r"^config.json: no such file .*missing$"):
        paths.open_regular(tmp_path / "missing", "config.json", ConfigError)
    with pytest.raises(FormatError, match=r"^the file: .* is a directory, not a regular file$"):
        paths.open_regular(tmp_path, "the file", FormatError)
    with pytest.raises(KvError, match=r"^the envelope: no such file"):  # read_regular's refusals are open_regular's
        paths.read_regular(tmp_path / "missing", "the envelope", KvError, limit=10)


def test_a_kind_of_file_without_a_name_is_still_a_sentence(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "_KINDS", ())  # as a kind this list does not name (a door, a port) is met
    with pytest.raises(FormatError, match=r" is a file of another kind, not a regular file$"):
        paths.open_regular(tmp_path, "the file", FormatError)


def test_a_read_that_fails_is_refused_with_the_systems_reason(tmp_path, monkeypatch):
    f = tmp_path / "f.bin"
    f.write_bytes(b"abc")
    real = paths.open_regular

    def failing_read(path, what, error):
        opened = real(path, what, error)
        opened.read = lambda n: (_ for _ in ()).throw(OSError(errno.EIO, "Input/output error"))
        return opened

    monkeypatch.setattr(paths, "open_regular", failing_read)
    with pytest.raises(FormatError) as e:
        paths.read_regular(f, "the file", FormatError, limit=10)
    assert str(e.value) == f"the file: cannot read {f}: Input/output error"


def test_a_named_pipe_is_refused_at_once_not_waited_on(tmp_path):
    """Opened without blocking: a FIFO nobody writes to would otherwise hang the open forever."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    result = []
    t = threading.Thread(target=lambda: result.append(_refusal(fifo)), daemon=True)
    t.start()
    t.join(10)
    assert result == ["the file: %s is a named pipe (FIFO), not a regular file" % fifo]


def _refusal(path) -> str:
    try:
        paths.open_regular(path, "the file", FormatError)
    except FormatError as exc:
        return str(exc)
    return "opened"


def test_a_file_over_the_limit_is_refused_with_both_sizes(tmp_path):
    f = tmp_path / "big.json"
    f.write_bytes(b"x" * 1001)
    with pytest.raises(ConfigError) as e:
        paths.read_regular(f, "config.json", ConfigError, limit=1000)
    assert str(e.value) == f"config.json: {f} has 1,001 bytes, over the 1,000-byte limit for this file"


def test_an_unopenable_path_says_why(tmp_path):
    with pytest.raises(FormatError, match=r"^the file: cannot open .*: File name too long$"):
        paths.open_regular(tmp_path / ("n" * 300), "the file", FormatError)
