# shellcheck shell=bash
# GPU visibility for the launch scripts (sourced). A machine "has a GPU" when nvidia-smi exists and lists at least
# one device; anything else (no driver, no device, an error) counts as none, so CPU machines get the preflight and
# a clear stop instead of a failure deep inside Ray or NCCL.

# Prints the number of GPUs nvidia-smi lists (0 when it is missing or fails).
recipe_gpu_count() {
    local listing
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        echo 0
        return
    fi
    listing="$(nvidia-smi -L 2>/dev/null)" || listing=""
    grep -c '^GPU [0-9]' <<<"$listing" || true
}
