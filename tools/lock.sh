#!/usr/bin/env bash
# Regenerates requirements.lock: every package of pyproject.toml's runtime, dev and hf sets (and all
# they need), pinned to one version with its sha256 hashes. tools/quickstart.sh installs from it, so a
# course runs on the versions its CI tested until someone runs this again (then runs the tests).
#
#   bash tools/lock.sh            # keep the versions already locked where pyproject.toml allows them
#   bash tools/lock.sh --upgrade  # move every package to its newest allowed version
#
# pip-compile (pip-tools) resolves with this machine's pip configuration, so torch resolves to the
# CPU build (2.13.0+cpu, from pip's find-links) with no nvidia-* packages, like the install does.
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS=${TL_LAB_LOCK_VENV:-.venv-lock}
[ -x "$TOOLS/bin/pip-compile" ] || { python3 -m venv "$TOOLS" && "$TOOLS/bin/pip" install -q "pip-tools==7.6.2"; }
CUSTOM_COMPILE_COMMAND="bash tools/lock.sh" "$TOOLS/bin/pip-compile" --quiet --generate-hashes --allow-unsafe \
    --strip-extras --extra dev --extra hf --no-emit-index-url --no-emit-find-links \
    --output-file requirements.lock "$@" pyproject.toml
if grep -q '^nvidia-' requirements.lock; then
    echo "requirements.lock lists nvidia-* packages: torch resolved to a CUDA build; see the README" >&2
    exit 1
fi
echo "requirements.lock: $(grep -c '^[a-z]' requirements.lock) packages pinned"
