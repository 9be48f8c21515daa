#!/usr/bin/env bash
# Regenerates the two locks from pyproject.toml, every package pinned to one version with its sha256
# hashes, for every platform (uv's universal resolution: Linux, macOS and Windows, x86_64 and arm64,
# Python 3.11.0 and later, platform-only packages such as appnope or pywinpty under their markers):
#
#   requirements.lock     the runtime and dev sets, and setuptools (the build backend of `pip install
#                         -e .`, so the install needs nothing from outside the lock). The lab and test
#                         commands of tools/quickstart.sh install this one: no torch, no transformers.
#   requirements-hf.lock  the runtime and hf sets (transformers, accelerate and what they and torch
#                         need), at the same versions as requirements.lock where the two meet. Torch
#                         itself is not in it: `quickstart.sh hf` installs torch==2.13.0's CPU build from
#                         where it lives for the platform (PyPI on macOS and Windows; PyTorch's CPU index
#                         or a local wheel folder on Linux), then this lock on top.
#
#   bash tools/lock.sh            # keep the versions already locked where pyproject.toml allows them
#   bash tools/lock.sh --upgrade  # move every package to its newest allowed version
#
# The resolution is uv's with no configuration of this machine (UV_NO_CONFIG; uv never reads pip's), so
# it is the same wherever it runs. --fork-strategy fewest keeps one version of a package for every
# Python (3.11.0 included: soupsieve 4.x needs 3.11.5, so 2.10 is locked for all).
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS=${TL_LAB_LOCK_VENV:-.venv-lock}
UV_VERSION=0.13.9
[ "$("$TOOLS/bin/uv" --version 2>/dev/null)" = "uv $UV_VERSION"* ] || {
    [ -x "$TOOLS/bin/python" ] || python3 -m venv "$TOOLS"
    "$TOOLS/bin/python" -m pip install -q "uv==$UV_VERSION"
}
export UV_NO_CONFIG=1
compile() {
    "$TOOLS/bin/uv" pip compile --quiet --universal --fork-strategy fewest --python-version 3.11 \
        --generate-hashes --custom-compile-command "bash tools/lock.sh" "$@"
}
build_backend=$("$TOOLS/bin/python" -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"], sep="\n")')

echo "$build_backend" | compile --extra dev --output-file requirements.lock "$@" pyproject.toml -

# The hf set. PyPI's torch declares CUDA packages for Linux (nvidia-*, cuda-*, triton: about 2.7 GB);
# the CPU builds quickstart installs declare none of them. A first resolution names them, the second
# excludes them: what is left is what the CPU builds need, on every platform.
scratch=$(mktemp -d); trap 'rm -rf "$scratch"' EXIT
compile --extra hf --constraints requirements.lock --output-file "$scratch/with-cuda.lock" pyproject.toml
grep -oE '^(nvidia-|cuda-|triton)[A-Za-z0-9_.-]*' "$scratch/with-cuda.lock" > "$scratch/cuda.txt" || true
compile --extra hf --constraints requirements.lock --excludes "$scratch/cuda.txt" --no-emit-package torch \
    --output-file requirements-hf.lock "$@" pyproject.toml

for lock in requirements.lock requirements-hf.lock; do
    if grep -qE '^(nvidia-|cuda-|triton)' "$lock"; then
        echo "$lock lists CUDA packages (nvidia-*, cuda-*, triton): torch's CPU build needs none; see the README" >&2
        exit 1
    fi
done
if grep -qE '^(torch|transformers|accelerate)==' requirements.lock; then
    echo "requirements.lock holds torch, transformers or accelerate: they belong to requirements-hf.lock" >&2
    exit 1
fi
echo "requirements.lock: $(grep -c '^[a-z]' requirements.lock) packages pinned;" \
     "requirements-hf.lock: $(grep -c '^[a-z]' requirements-hf.lock) (without torch: $(wc -l < "$scratch/cuda.txt") CUDA packages excluded)"
"$TOOLS/bin/python" tools/make_environment.py  # environment.yml and environment-hf.yml at the locks' versions
