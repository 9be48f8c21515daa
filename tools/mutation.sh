#!/usr/bin/env bash
# Mutation testing of tl_lab (issue 20): how many of the mistakes a developer makes do the tests catch?
# Writes benchmarks/results/mutation.json (tools/mutation.py says how). Slow, so not in CI: each
# module is a few minutes with one worker; the whole run, about an hour on two shared cores.
#
#   tools/mutation.sh [LABEL [REF [SAMPLE]]]    default: after HEAD 40
#
# LABEL names the results (before / after), REF is the git commit mutated (its tests included),
# SAMPLE the seeded number of mutants per module ("all" for every one). Needs mutmut:
#   pip install mutmut   (3.8.1 was used); the pipeline module's mutants also need pip install 'tbb<2023'.
# Then python benchmarks/mutation_table.py --write puts the scores into README.md's table.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
label=${1:-after}
ref=${2:-HEAD}
sample=${3:-40}
"$PY" -c 'import mutmut' 2>/dev/null || { echo "mutation.sh needs mutmut: pip install mutmut==3.8.1" >&2; exit 2; }
args=(--label "$label" --ref "$ref" --budget "${TL_LAB_MUTATION_BUDGET:-600}")
[ "$sample" = all ] || args+=(--sample "$sample")
nice -n 10 "$PY" tools/mutation.py "${args[@]}" --kernels all
