#!/usr/bin/env bash
# The README's two commands. Each sets everything up from a fresh clone, then:
#   lab   opens the guided walkthrough in JupyterLab, rooted at the repository
#   test  runs every test: pytest (with hypothesis) over tests/ and nbval over notebooks/
# Needs only Python 3.11+ with venv and pip. Safe to run again: every step is idempotent, and the
# install is skipped when requirements.lock and pyproject.toml are what the venv was built from.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-}
case "$mode" in lab|test) ;; *) echo "usage: tools/quickstart.sh lab|test [extra arguments]" >&2; exit 2 ;; esac

PYTHON=${PYTHON:-python3}
VENV=${TL_LAB_VENV:-.venv}
LOCK=requirements.lock  # the exact tested versions (bash tools/lock.sh regenerates it from pyproject.toml)
step() { printf '\n==> %s\n' "$*"; }

step "virtual environment in $VENV"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
# shellcheck disable=SC1091
. "$VENV/bin/activate"
python -c 'import sys; assert sys.version_info >= (3, 11), "tl_lab needs Python 3.11+"'

# One environment for both commands: the locked runtime, dev and hf sets (pip finds torch's CPU build).
STAMP="$VENV/.tl_lab-installed"
want=$(cat "$LOCK" pyproject.toml | python -c 'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())')
installed() { python -c 'import importlib.metadata as m; m.version("tl_lab"); m.version("jupyterlab")' 2>/dev/null; }
if [ "$(cat "$STAMP" 2>/dev/null)" = "$want" ] && installed; then
    step "dependencies already installed from $LOCK (unchanged since; delete $STAMP to force)"
else
    step "installing the locked dependencies from $LOCK (hash-checked), then tl_lab itself (editable)"
    python -m pip install -q --upgrade pip
    python -m pip install -q -r "$LOCK"
    # setuptools' "Editable installation ... be careful with folders" notice is for other layouts:
    # tl_lab/ in the clone IS the package, so keep a newcomer's first screen clean
    PYTHONWARNINGS="ignore:Editable installation" python -m pip install -q --no-deps --no-build-isolation -e .
    echo "$want" > "$STAMP"
fi

step "fetching SmolLM2-135M-Instruct into the user cache (once)"
python -m tl_lab fetch smollm2

if [ "$mode" = lab ]; then
    step "opening the walkthrough (Ctrl-C stops JupyterLab)"
    ROOT_FLAG=(); [ "$(id -u)" = 0 ] && ROOT_FLAG=(--allow-root)  # JupyterLab refuses root without it
    # Rooted at the repository (tl_lab/, docs/, tests/ in the file browser; terminals start here),
    # opening the first notebook. A notebook path as an argument would root the lab at notebooks/.
    exec jupyter lab "${ROOT_FLAG[@]}" --ServerApp.root_dir="$PWD" \
        --LabApp.default_url=/lab/tree/notebooks/00_start_here.ipynb "${@:2}"
fi

step "a real browser for the JupyterLab tests (Debian's chromium)"
if ! command -v chromium >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium >/dev/null
fi
step "pytest over tests/ and nbval over notebooks/"
exec python -m pytest --nbval-lax tests notebooks "${@:2}"
