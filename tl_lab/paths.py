"""Where tl_lab finds its bundled data and its cache of downloaded models."""

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = REPO_ROOT / "data"
GOLDEN_DIR = DATA_DIR / "golden"


def cache_dir() -> Path:
    """The user cache for fetched models: $TL_LAB_CACHE, else $XDG_CACHE_HOME/tl_lab, else ~/.cache/tl_lab."""
    if os.environ.get("TL_LAB_CACHE"):
        return Path(os.environ["TL_LAB_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "tl_lab"
