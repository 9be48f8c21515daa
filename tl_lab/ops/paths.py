"""Where tl_lab finds its bundled data and its cache of downloaded models, and how it opens them.

The bundled data (`data/`: models and golden files) and config.json's schema (`docs/formats/`) ship
inside the wheel as `tl_lab/_data` and `tl_lab/_formats`, so an installed copy (`pip install .`, run
far from any repository) finds them too; a checkout uses its own folders.
"""

import os
import stat
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # tl_lab/, this file being tl_lab/ops/paths.py
REPO_ROOT = PACKAGE_DIR.parent  # the repository of a source checkout (tests, tools and notebooks use it)


def _shipped(installed: str, checkout: Path) -> Path:
    """A data folder: inside the installed package (pyproject's package-dir maps it there), else the
    checkout's own folder (a source tree or an editable install, where nothing is copied)."""
    inside = PACKAGE_DIR / installed
    return inside if inside.is_dir() else checkout


DATA_DIR = _shipped("_data", REPO_ROOT / "data")  # bundled models and golden files
FORMATS_DIR = _shipped("_formats", REPO_ROOT / "docs" / "formats")  # config.schema.json and the format notes
GOLDEN_DIR = DATA_DIR / "golden"


def cache_dir() -> Path:
    """The user cache for fetched models: $TL_LAB_CACHE, else $XDG_CACHE_HOME/tl_lab, else ~/.cache/tl_lab."""
    if os.environ.get("TL_LAB_CACHE"):
        return expand_user(os.environ["TL_LAB_CACHE"], "TL_LAB_CACHE")
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "tl_lab"


def expand_user(text: str, what: str) -> Path:
    """Path(text) with a leading ~ or ~user expanded; ConfigError naming `what` (the option or the
    variable it came from) when there is no such user or home (pathlib raises a bare RuntimeError)."""
    from tl_lab.errors import ConfigError

    try:
        return Path(text).expanduser()
    except RuntimeError as exc:
        raise ConfigError(f"{what} {text}: cannot expand {text.split('/')[0]!r} ({exc})") from None


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def open_regular(path, what: str, error: type[Exception]):
    """`path` opened for binary reading if it is a regular file, else `error` naming `what` and why.

    Opened non-blocking and checked with fstat, so a FIFO is refused instead of waiting forever for a
    writer, and a directory gets a sentence instead of IsADirectoryError.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise error(f"{what}: no such file {path}") from None
    except OSError as exc:
        raise error(f"{what}: cannot open {path}: {exc.strerror or exc}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise error(f"{what}: {path} is {file_kind(mode)}, not a regular file")
    return os.fdopen(fd, "rb")


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is, for a message: "a directory", "a named pipe (FIFO)", ..."""
    return next((name for test, name in _KINDS if test(mode)), "a file of another kind")


def read_regular(path, what: str, error: type[Exception], limit: int, limit_of: str = "this file") -> bytes:
    """The bytes of the regular file `path` (see `open_regular`), refused past `limit` bytes, which
    the message calls the limit for `limit_of`."""
    with open_regular(path, what, error) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise error(f"{what}: {path} has {size:,} bytes, over the {limit:,}-byte limit for {limit_of}")
        try:
            return f.read(size + 1)  # not read(limit): that allocates the whole limit up front
        except OSError as exc:
            raise error(f"{what}: cannot read {path}: {exc.strerror or exc}") from None
