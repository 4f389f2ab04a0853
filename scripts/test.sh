#!/usr/bin/env bash
# The test command: bootstrap .venv (pinned CPU stack, skipped when up to date), then run pytest.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not engine"` or `bash scripts/test.sh tests/core`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/bootstrap_venv.sh
bash scripts/lib/install_sandbox.sh  # bubblewrap for the Python tool's sandbox tests (apt-get; never fatal)
source scripts/lib/cpu_env.sh
exec "$ROOT/.venv/bin/python" -m pytest "$@"
