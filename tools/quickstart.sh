#!/usr/bin/env bash
# The README's three commands. Each sets everything up from a fresh clone, then:
#   lab   opens the guided walkthrough in JupyterLab, rooted at the repository
#   test  runs every test that needs no torch: pytest (with hypothesis) over tests/ and nbval over
#         notebooks/, the hf-marked tests left to the hf step (the run says how many)
#   hf    adds the real reference (torch's CPU build, transformers) and runs the hf-marked tests:
#         the live comparisons with Hugging Face and the golden files' regeneration
# Needs only Python 3.11+ with venv and pip, and bash (Linux, macOS; Windows: WSL, see the README).
# Safe to run again: every step is idempotent, and an install is skipped when its lock and
# pyproject.toml are what the venv was built from.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-}
case "$mode" in lab|test|hf) ;; *) echo "usage: tools/quickstart.sh lab|test|hf [extra arguments]" >&2; exit 2 ;; esac

PYTHON=${PYTHON:-python3}
VENV=${TL_LAB_VENV:-.venv}
LOCK=requirements.lock        # every platform's exact tested versions, no torch (bash tools/lock.sh)
HF_LOCK=requirements-hf.lock  # transformers, accelerate and what torch needs, on top of $LOCK
TORCH=2.13.0                  # pyproject.toml's hf pin; its CPU build is installed by hf_torch below
TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
step() { printf '\n==> %s\n' "$*"; }
digest() { cat "$@" | python -c 'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())'; }

step "virtual environment in $VENV"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
# shellcheck disable=SC1091
. "$VENV/bin/activate"
python -c 'import sys; assert sys.version_info >= (3, 11), "tl_lab needs Python 3.11+"'

# The lab and test commands' environment: the locked runtime and dev sets, setuptools among them (so the
# editable install builds without fetching anything outside the lock).
STAMP="$VENV/.tl_lab-installed"
want=$(digest "$LOCK" pyproject.toml)
installed() { python -c 'import importlib.metadata as m; m.version("tl_lab"); m.version("jupyterlab")' 2>/dev/null; }
if [ "$(cat "$STAMP" 2>/dev/null)" = "$want" ] && installed; then
    step "dependencies already installed from $LOCK (unchanged since; delete $STAMP to force)"
else
    step "installing the locked dependencies from $LOCK (hash-checked), then tl_lab itself (editable)"
    python -m pip install -q --upgrade pip
    python -m pip install -q --require-hashes -r "$LOCK"
    # setuptools' "Editable installation ... be careful with folders" notice is for other layouts:
    # tl_lab/ in the clone IS the package, so keep a newcomer's first screen clean
    PYTHONWARNINGS="ignore:Editable installation" python -m pip install -q --no-deps --no-build-isolation -e .
    echo "$want" > "$STAMP"
fi

step "fetching SmolLM2-135M-Instruct into the user cache (once)"
python -m tl_lab fetch smollm2

if [ "$mode" != hf ]; then
    # the kernels compile for this processor the first time they run: here, with a line saying so, not in
    # silence under the first notebook (a stamp in tl_lab/ops/__pycache__ skips it the next time). The test
    # command too: its workers and every workspace's sandboxed check then load them instead of compiling
    # them each (tl_lab.lab.exercise.sandbox.seed_numba_cache)
    step "the engine's compiled kernels"
    python -m tl_lab.lab.warm
fi

if [ "$mode" = lab ]; then
    # no "get notified about official Jupyter news?" pop-up over the widgets: news and update checks off
    # in this venv's JupyterLab (its settings overrides), as tests/lab_harness.py has them
    python - "$VENV/share/jupyter/lab/settings/overrides.json" <<'PY'
import json, pathlib, sys
path = pathlib.Path(sys.argv[1])
path.parent.mkdir(parents=True, exist_ok=True)
old = json.loads(path.read_text()) if path.exists() else {}
old["@jupyterlab/apputils-extension:notification"] = {"fetchNews": "false", "checkForUpdates": False}
path.write_text(json.dumps(old, indent=2))
PY
    step "opening the walkthrough (Ctrl-C stops JupyterLab)"
    ROOT_FLAG=(); [ "$(id -u)" = 0 ] && ROOT_FLAG=(--allow-root)  # JupyterLab refuses root without it
    # Rooted at the repository (tl_lab/, docs/, tests/ in the file browser; terminals start here),
    # opening the first notebook. A notebook path as an argument would root the lab at notebooks/.
    exec jupyter lab "${ROOT_FLAG[@]}" --ServerApp.root_dir="$PWD" --LabApp.news_url=None \
        --LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate \
        --LabApp.default_url=/lab/tree/notebooks/00_start_here.ipynb "${@:2}"
fi

# torch 2.13.0's CPU build, from where it lives: PyPI's wheels are CPU-only on macOS and Windows; on
# Linux PyPI's pull about 2.7 GB of CUDA packages, so the CPU build comes from a local wheel folder in
# pip's configuration (find-links; tried first, no network) or else PyTorch's CPU index.
hf_torch() {
    if python -c "import importlib.metadata as m, sys; sys.exit(m.version('torch').split('+')[0] != '$TORCH')" 2>/dev/null; then
        return
    fi
    if [ "$(uname -s)" != Linux ]; then
        python -m pip install -q --no-deps "torch==$TORCH"
    elif python -m pip install -q --no-deps --no-index "torch==$TORCH+cpu" 2>/dev/null; then
        echo "torch $TORCH+cpu from the wheel folder in pip's configuration"
    elif python -c "import urllib.request; urllib.request.urlopen('$TORCH_CPU_INDEX/torch/', timeout=15)" 2>/dev/null; then
        python -m pip install -q --no-deps --index-url "$TORCH_CPU_INDEX" "torch==$TORCH+cpu"
    else
        echo "torch $TORCH+cpu: $TORCH_CPU_INDEX is not reachable and no wheel folder in pip's configuration has it; put torch-$TORCH+cpu-*.whl in a folder and rerun with PIP_FIND_LINKS=that-folder" >&2
        exit 1
    fi
}

if [ "$mode" = hf ]; then
    HF_STAMP="$VENV/.tl_lab-hf-installed"
    want_hf=$(digest "$LOCK" "$HF_LOCK" pyproject.toml)
    if [ "$(cat "$HF_STAMP" 2>/dev/null)" = "$want_hf" ] && python -c 'import torch, transformers' 2>/dev/null; then
        step "the hf set already installed from $HF_LOCK (delete $HF_STAMP to force)"
    else
        step "installing torch $TORCH (CPU build), then the hf set from $HF_LOCK (hash-checked)"
        hf_torch
        python -m pip install -q --require-hashes -r "$HF_LOCK"
        echo "$want_hf" > "$HF_STAMP"
    fi
    step "the hf-marked tests: the live comparisons with transformers and the golden files' regeneration"
    exec python -m pytest -m hf tests "${@:2}"
fi

# A chromium or Chrome for the JupyterLab tests (tests/lab_harness.py finds it the same way). Where none
# is found and apt is there, Debian's; otherwise one line says how to get one. Never a reason to stop
# here: the browser tests then fail with that line, after every other test ran.
step "a real browser for the JupyterLab tests"
find_browser() { python tests/lab_harness.py --find-browser 2>/dev/null; }
if ! find_browser; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo -n"
    if command -v apt-get >/dev/null 2>&1 && { [ -z "$SUDO" ] || sudo -n true 2>/dev/null; }; then
        { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium >/dev/null; } || true
    fi
    find_browser || python tests/lab_harness.py --find-browser || true  # the second prints the how-to line
fi

step "pytest over tests/ and nbval over notebooks/ (the hf-marked tests: bash tools/quickstart.sh hf)"
# -n auto: workers from the machine (the root conftest.py says how many); each file on one worker
exec python -m pytest --nbval-lax -m "not hf" -n auto --dist loadfile tests notebooks "${@:2}"
