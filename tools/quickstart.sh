#!/usr/bin/env bash
# The README's two commands. Each sets everything up from a fresh clone, then:
#   lab   opens the guided walkthrough in JupyterLab
#   test  runs every test: pytest (with hypothesis) over tests/ and nbval over notebooks/
# Needs only Python 3.11+ with venv and pip. Safe to run again: every step is idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-}
case "$mode" in lab|test) ;; *) echo "usage: tools/quickstart.sh lab|test" >&2; exit 2 ;; esac

PYTHON=${PYTHON:-python3}
VENV=${TL_LAB_VENV:-.venv}
step() { printf '\n==> %s\n' "$*"; }

step "virtual environment in $VENV"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
# shellcheck disable=SC1091
. "$VENV/bin/activate"
python -c 'import sys; assert sys.version_info >= (3, 11), "tl_lab needs Python 3.11+"'
python -m pip install -q --upgrade pip

if [ "$mode" = lab ]; then
    step "installing tl_lab with the dev extra (JupyterLab, widgets)"
    python -m pip install -q -e '.[dev]'
    step "fetching SmolLM2-135M-Instruct into the user cache (once)"
    python -m tl_lab fetch smollm2
    step "opening the walkthrough (Ctrl-C stops JupyterLab)"
    ROOT_FLAG=(); [ "$(id -u)" = 0 ] && ROOT_FLAG=(--allow-root)  # JupyterLab refuses root without it
    exec jupyter lab "${ROOT_FLAG[@]}" "${@:2}" notebooks/00_start_here.ipynb
fi

step "installing tl_lab with the dev and hf extras (hf: transformers, torch==2.13.0 for golden checks)"
python -m pip install -q -e '.[dev,hf]'
step "fetching SmolLM2-135M-Instruct into the user cache (once)"
python -m tl_lab fetch smollm2
step "a real browser for the JupyterLab tests (Debian's chromium)"
if ! command -v chromium >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium >/dev/null
fi
step "pytest over tests/ and nbval over notebooks/"
exec python -m pytest --nbval-lax tests notebooks "${@:2}"
