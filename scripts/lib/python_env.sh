# shellcheck shell=bash
# Which Python runs the recipe (sourced by train_grpo.sh and convert_hf_to_distcp.sh). The GPU cluster uses its own
# stack (requirements/gpu.txt: verl[megatron,vllm]==0.9.1), not the CPU test venv; the first match wins:
#   1. $RECIPE_PYTHON                          (an interpreter you manage)
#   2. <repo>/.venv-gpu, once fully installed  (marker file .recipe-gpu-ready)
#   3. python3, if it imports verl             (a cluster image with verl preinstalled)
#   4. on a GPU machine: create <repo>/.venv-gpu from requirements/gpu.txt plus this repo (editable, compat mode)
#   5. otherwise (CPU): the repo's test venv via scripts/bootstrap_venv.sh; enough for the preflight and DRY_RUN.
# The chosen interpreter is printed on stdout; progress goes to stderr.

# shellcheck source=scripts/lib/gpu.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu.sh"

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
        [[ -x "$venv/bin/python" ]] || python3 -m venv "$venv" >&2
        "$venv/bin/python" -m pip install --disable-pip-version-check -q -r "$root/requirements/gpu.txt" >&2
        # compat mode: a namespace dir named `recipe` from TransferQueue must not shadow this package.
        "$venv/bin/python" -m pip install --disable-pip-version-check -q -e "$root" \
            --config-settings editable_mode=compat >&2
        touch "$venv/.recipe-gpu-ready"
        echo "$venv/bin/python"
    else
        echo "python_env: no GPU and no python with verl: using the CPU test venv (preflight and DRY_RUN only)" >&2
        bash "$root/scripts/bootstrap_venv.sh" >&2
        echo "$root/.venv/bin/python"
    fi
}
