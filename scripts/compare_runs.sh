#!/usr/bin/env bash
# Compare two runs from their logs (verl file-logger JSONL + length traces): prints a markdown table of
# B vs A and writes it with PNG plots to --out (default ./compare_<A>_vs_<B>/).
# Usage: scripts/compare_runs.sh RUN_A RUN_B [--out DIR] [--names A,B]
# Argument checks and their messages live in recipe/report/cli.py; this wrapper only picks the interpreter.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -x "$ROOT/.venv/bin/python" ]]; then
    PY="$ROOT/.venv/bin/python"
elif ! PY="$(command -v python3)"; then
    echo "compare_runs.sh: no Python: run 'bash scripts/bootstrap_venv.sh' to create .venv, or install python3" >&2
    exit 2
fi
# Run paths stay relative to the caller's directory; PYTHONPATH makes this checkout's `recipe` the one imported.
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -c 'import sys; from recipe.report.cli import main; sys.exit(main(sys.argv[1:], "compare_runs.sh"))' "$@"
