#!/usr/bin/env bash
# Compare two runs from their logs (verl file-logger JSONL, length traces, Hydra's config.yaml of each launch):
# prints the config keys that differ (a WARNING for any beyond the arms' own switches), a markdown table of B vs A,
# and writes both with PNG plots (time per step, lengths, cap, validation score over steps and training time) to
# --out (default ./compare_<A>_vs_<B>/).
# Usage: scripts/compare_runs.sh RUN_A RUN_B [--out DIR] [--names A,B]
# Argument checks and their messages live in recipe/report/cli.py; this wrapper only picks the interpreter.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -x "${RECIPE_VENV:-$ROOT/.venv}/bin/python" ]]; then
    PY="${RECIPE_VENV:-$ROOT/.venv}/bin/python"
elif ! PY="$(command -v python3)"; then
    echo "compare_runs.sh: no Python: run 'bash scripts/bootstrap_venv.sh' to create .venv, or install python3" >&2
    exit 2
fi
# Run paths stay relative to the caller's directory; PYTHONPATH makes this checkout's `recipe` the one imported.
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -c 'import sys; from recipe.report.cli import main; sys.exit(main(sys.argv[1:], "compare_runs.sh"))' "$@"
