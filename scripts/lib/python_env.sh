# shellcheck shell=bash
# Which Python runs the recipe (sourced by train_grpo.sh and convert_hf_to_distcp.sh). The GPU cluster uses its own
# stack (docs/install-gpu.md; the supported one is verl's image), not the CPU test venv; the first match wins:
#   1. $RECIPE_PYTHON                          (an interpreter you manage, e.g. verl's image's python3)
#   2. <repo>/.venv-gpu, once fully installed  (marker file .recipe-gpu-ready)
#   3. python3, if it imports verl             (a cluster image with verl preinstalled)
#   4. on a GPU machine: create <repo>/.venv-gpu from requirements/gpu.txt, requirements/gpu-no-deps.txt (--no-deps)
#      and this repo (editable, compat mode), check it with `python -m recipe.stack_versions`, then mark it ready
#   5. otherwise (CPU): the repo's test venv via scripts/bootstrap_venv.sh; enough for the preflight and DRY_RUN.
# The chosen interpreter is printed on stdout; progress goes to stderr. Any failed step fails the call (status 1),
# names the command and leaves no marker, also under `PY="$(recipe_python ...)" || die`, where errexit is off.

# shellcheck source=scripts/lib/gpu.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu.sh"

# recipe_step COMMAND...: run COMMAND with its output on stderr; on failure, name it and return its status.
recipe_step() {
    local status=0
    "$@" >&2 || status=$?
    if (( status != 0 )); then
        echo "python_env: FAILED (exit $status): $(printf '%q ' "$@")" >&2
    fi
    return "$status"
}

# recipe_create_venv_gpu ROOT VENV: install the GPU stack into VENV; the marker is written only if every step passed.
recipe_create_venv_gpu() {
    local root="$1" venv="$2"
    local py="$venv/bin/python"
    rm -f "$venv/.recipe-gpu-ready"
    if [[ ! -x "$py" ]]; then
        recipe_step python3 -m venv "$venv" || return 1
    fi
    recipe_step "$py" -m pip install --disable-pip-version-check -q -r "$root/requirements/gpu.txt" || return 1
    # megatron-bridge without its dependencies, as verl does (its PyPI pins conflict with vLLM's: see the file).
    recipe_step "$py" -m pip install --disable-pip-version-check -q --no-deps \
        -r "$root/requirements/gpu-no-deps.txt" || return 1
    # compat mode: a namespace dir named `recipe` from TransferQueue must not shadow this package.
    recipe_step "$py" -m pip install --disable-pip-version-check -q -e "$root" \
        --config-settings editable_mode=compat || return 1
    # verl 0.9.1, Python 3.12, vLLM's and torch's CUDA builds, Megatron-Core/-Bridge and TE's PyTorch extension.
    recipe_step "$py" -m recipe.stack_versions --target gpu || return 1
    touch "$venv/.recipe-gpu-ready"
}

# recipe_python ROOT: print the interpreter to use (creating .venv-gpu or .venv when needed).
recipe_python() {
    local root="$1" venv="$1/.venv-gpu"
    if [[ -n "${RECIPE_PYTHON:-}" ]]; then
        local py
        if ! py="$(command -v "$RECIPE_PYTHON")"; then
            echo "python_env: RECIPE_PYTHON=$RECIPE_PYTHON is not an executable; point it at a python with verl 0.9.1" >&2
            return 1
        fi
        # absolute, so that it still works after a cd
        [[ "$py" == /* ]] || py="$(cd "$(dirname "$py")" && pwd)/$(basename "$py")"
        echo "$py"
    elif [[ -x "$venv/bin/python" && -f "$venv/.recipe-gpu-ready" ]]; then
        echo "$venv/bin/python"
    elif command -v python3 >/dev/null 2>&1 && python3 -c 'import verl' >/dev/null 2>&1; then
        command -v python3
    elif (( $(recipe_gpu_count) > 0 )); then
        echo "python_env: creating $venv from requirements/gpu.txt (once; several minutes)" >&2
        if ! recipe_create_venv_gpu "$root" "$venv"; then
            echo "python_env: $venv is not ready (no $venv/.recipe-gpu-ready): fix the failed step above and rerun," \
                "or run in verl's image and set RECIPE_PYTHON (docs/install-gpu.md)" >&2
            return 1
        fi
        echo "$venv/bin/python"
    else
        echo "python_env: no GPU and no python with verl: using the CPU test venv (preflight and DRY_RUN only)" >&2
        recipe_step bash "$root/scripts/bootstrap_venv.sh" || return 1
        echo "${RECIPE_VENV:-$root/.venv}/bin/python"
    fi
}
