#!/usr/bin/env bash
# Rehearse CI as it runs: a fresh clone of HEAD in a new directory, `CI=true bash .ci/run` there with no standard
# input, optionally beside a CPU-bound load (a loaded CI machine is what made tests flake), then the exit status and
# the wall time. Each rehearsal appends one line to .cache/ci-rehearsals.log here (docs/testing.md quotes them).
#
# Usage: bash scripts/ci_rehearsal.sh [--load N] [--runs K] [--keep]
#   --load N   N busy processes (one core each) for the whole rehearsal (default 0)
#   --runs K   K rehearsals in a row, each in its own fresh clone; stops at the first red one (default 1)
#   --keep     keep the clones (default: removed after a green run, kept after a red one for inspection)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
load=0 runs=1 keep=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --load) load="${2:?--load needs a number of processes}"; shift 2 ;;
        --runs) runs="${2:?--runs needs a count}"; shift 2 ;;
        --keep) keep=1; shift ;;
        *) echo "ci_rehearsal: unknown argument '$1' (use --load N, --runs K, --keep)" >&2; exit 2 ;;
    esac
done
[[ "$load" =~ ^[0-9]+$ && "$runs" =~ ^[1-9][0-9]*$ ]] || { echo "ci_rehearsal: --load and --runs take integers" >&2; exit 2; }
if [[ -n "$(git -C "$ROOT" status --porcelain --untracked-files=no)" ]]; then
    echo "ci_rehearsal: uncommitted changes are not in the clone; commit first (HEAD is what is rehearsed)" >&2
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
    start=$(date +%s)
    set +e
    (cd "$dir/repo" && CI=true bash .ci/run </dev/null >"$dir/ci.log" 2>&1)
    rc=$?
    set -e
    minutes="$(awk -v s="$(( $(date +%s) - start ))" 'BEGIN { printf "%.1f", s / 60 }')"
    summary="$(grep -E '^=+ .*(passed|failed|error).* =+$' "$dir/ci.log" | tr '\n' ' ')"
    line="$(date -u +%FT%TZ) commit=$commit run=$r/$runs load=$load exit=$rc minutes=$minutes $summary log=$dir/ci.log"
    echo "$line" | tee -a "$log"
    if [[ $rc -ne 0 ]]; then
        echo "ci_rehearsal: red; the clone and its log are kept in $dir" >&2
        exit "$rc"
    fi
    [[ $keep -eq 1 ]] || rm -rf "$dir/repo"
done
