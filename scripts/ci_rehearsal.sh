#!/usr/bin/env bash
# Rehearse CI as it runs: a fresh clone of HEAD in a new directory, `CI=true bash .ci/run` there with no standard
# input, optionally beside a CPU-bound load (a loaded CI machine is what made tests flake), then the exit status and
# the wall time. Each rehearsal appends one line to .cache/ci-rehearsals.log here (docs/testing.md quotes them).
#
# Usage: bash scripts/ci_rehearsal.sh [--load N] [--runs K] [--keep] [--quick]
#   --load N   N busy processes (one core each) for the whole rehearsal (default 0)
#   --runs K   K rehearsals in a row, each in its own fresh clone; stops at the first red one (default 1)
#   --keep     keep the clones (default: removed after a green run, kept after a red one for inspection)
#   --quick    the README's test command instead of .ci/run: the clone's venv and tiny models are built first
#              (timed apart: a contributor has them), then `bash scripts/test.sh` (the quick tier) is timed
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
load=0 runs=1 keep=0 quick=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --load) load="${2:?--load needs a number of processes}"; shift 2 ;;
        --runs) runs="${2:?--runs needs a count}"; shift 2 ;;
        --keep) keep=1; shift ;;
        --quick) quick=1; shift ;;
        *) echo "ci_rehearsal: unknown argument '$1' (use --load N, --runs K, --keep, --quick)" >&2; exit 2 ;;
    esac
done
[[ "$load" =~ ^[0-9]+$ && "$runs" =~ ^[1-9][0-9]*$ ]] || { echo "ci_rehearsal: --load and --runs take integers" >&2; exit 2; }
if [[ -n "$(git -C "$ROOT" status --porcelain --untracked-files=no)" ]]; then
    echo "ci_rehearsal: note: uncommitted changes are not in the clone; HEAD is what is rehearsed" >&2
fi
commit="$(git -C "$ROOT" rev-parse --short HEAD)"
log="$ROOT/.cache/ci-rehearsals.log"
mkdir -p "$(dirname "$log")"

hogs=()
stop_load() { [[ ${#hogs[@]} -gt 0 ]] && kill "${hogs[@]}" 2>/dev/null; hogs=(); }
trap stop_load EXIT
for ((i = 0; i < load; i++)); do
    python3 -c 'while True: pass' &
    hogs+=($!)
done

for ((r = 1; r <= runs; r++)); do
    dir="$(mktemp -d /tmp/ci-rehearsal-XXXXXX)"
    git clone -q "$ROOT" "$dir/repo"
    git -C "$dir/repo" checkout -q "$commit"
    setup=""
    if (( quick )); then
        start=$(date +%s)
        (cd "$dir/repo" && bash scripts/bootstrap_venv.sh && bash scripts/lib/install_sandbox.sh && source \
            scripts/lib/cpu_env.sh && .venv/bin/python -c "from recipe.cpu.preset import cpu_env
cpu_env({'MULTI_TURN': '1'}); cpu_env({'CPU_MODEL': 'random'})") </dev/null >"$dir/setup.log" 2>&1 \
            || { echo "ci_rehearsal: the set-up failed: $dir/setup.log" >&2; exit 1; }
        setup="setup_minutes=$(awk -v s="$(( $(date +%s) - start ))" 'BEGIN { printf "%.1f", s / 60 }') "
    fi
    start=$(date +%s)
    set +e
    if (( quick )); then
        (cd "$dir/repo" && CI=true bash scripts/test.sh </dev/null >"$dir/ci.log" 2>&1)
    else
        (cd "$dir/repo" && CI=true bash .ci/run </dev/null >"$dir/ci.log" 2>&1)
    fi
    rc=$?
    set -e
    minutes="$(awk -v s="$(( $(date +%s) - start ))" 'BEGIN { printf "%.1f", s / 60 }')"
    summary="$(grep -E '^=+ .*(passed|failed|error).* =+$' "$dir/ci.log" | tr '\n' ' ')"
    what="$( (( quick )) && echo "test.sh" || echo ".ci/run")"
    line="$(date -u +%FT%TZ) commit=$commit $what run=$r/$runs load=$load exit=$rc ${setup}minutes=$minutes $summary log=$dir/ci.log"
    echo "$line" | tee -a "$log"
    if [[ $rc -ne 0 ]]; then
        echo "ci_rehearsal: red; the clone and its log are kept in $dir" >&2
        exit "$rc"
    fi
    [[ $keep -eq 1 ]] || rm -rf "$dir/repo"
done
