# shellcheck shell=bash
# The Megatron check on a lent GPU (scripts/gpu_check.sh --fetch-wheels / --device; requirements/device-megatron.txt).
# Sourced by scripts/gpu_check.sh, which defines die() and ROOT.

DEVICE_REQ="$ROOT/requirements/device-megatron.txt"
DEVICE_WHEELS="${GPU_CHECK_WHEELS:-$ROOT/.whl}"  # the device tool carries a path of the checkout
DEVICE_CARRY_LIMIT_MIB=60  # the device tool carries 64 MiB per call, the working tree included

# device_section NAME: the pins under "# --NAME" in requirements/device-megatron.txt
device_section() {
    sed -n "/^# --$1\$/,/^# --/{/^#/d;/^\$/d;p}" "$DEVICE_REQ"
}

# fetch_device_wheels PY: download the wheels for CPython 3.12 / manylinux x86_64 into .whl/ (needs PyPI), and
# record the R3 step's routes on vLLM CPU into .whl/r3 (needs the CPU stack).
fetch_device_wheels() {
    local py="$1" tmp mib
    mkdir -p "$(dirname "$DEVICE_WHEELS")"
    tmp="$(mktemp -d "$DEVICE_WHEELS.tmp.XXXXXX")"
    local -a pip=("$py" -m pip --disable-pip-version-check -q download --dest "$tmp" --python-version 3.12
                  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
                  --platform manylinux2014_x86_64 --only-binary=:all:)
    local -a nodeps withdeps sdist
    mapfile -t nodeps < <(device_section no-deps)
    mapfile -t withdeps < <(device_section with-deps)
    mapfile -t sdist < <(device_section sdist)
    if ! "${pip[@]}" --no-deps "${nodeps[@]}" || ! "${pip[@]}" "${withdeps[@]}" ||
            ! "$py" -m pip --disable-pip-version-check -q download --dest "$tmp" --no-deps --no-binary=:all: \
                "${sdist[@]}"; then
        rm -rf "$tmp"
        die "could not download the device wheels (above); nothing was changed in $DEVICE_WHEELS"
    fi
    # the R3 replay step's inputs: routes vLLM CPU records here (the lent GPU has no vLLM), and the model they are of
    if ! "$py" -m recipe.route_record "$tmp/r3"; then
        rm -rf "$tmp"
        die "could not record the routes for the R3 step (above); nothing was changed in $DEVICE_WHEELS"
    fi
    mib=$(( $(du -sk "$tmp" | cut -f1) / 1024 ))
    if (( mib > DEVICE_CARRY_LIMIT_MIB )); then
        rm -rf "$tmp"
        die "the device wheels take $mib MiB, more than the $DEVICE_CARRY_LIMIT_MIB MiB a device call can carry"
    fi
    rm -rf "$DEVICE_WHEELS"
    mv "$tmp" "$DEVICE_WHEELS"
    echo "gpu_check.sh: $(find "$DEVICE_WHEELS" -type f | wc -l) files, $mib MiB in $DEVICE_WHEELS;" \
        "on the lent GPU: bash scripts/gpu_check.sh --device (carry .whl)" >&2
}

# run_device_check PY WORK DRY: install .whl/ into a venv over PY's packages (offline), then the Megatron check
# and the R3 replay of the routes .whl/r3 carries (bf16 and fp32 on the GPU against vLLM CPU's fp32 routes).
run_device_check() {
    local py="$1" work="$2" dry="$3" venv="$2/venv"
    local -a nodeps withdeps sdist commands
    mapfile -t nodeps < <(device_section no-deps)
    mapfile -t withdeps < <(device_section with-deps)
    mapfile -t sdist < <(device_section sdist)
    local -a pip=("$venv/bin/python" -m pip --disable-pip-version-check -q install --no-index --find-links
                  "$DEVICE_WHEELS")
    # each command quoted once here (printf %q) and run with eval below: paths with spaces stay one word
    commands=(
        "$(printf '%q ' "$py" -m venv --system-site-packages "$venv")"
        "$(printf '%q ' "${pip[@]}" --no-deps "${nodeps[@]}")"
        "$(printf '%q ' "${pip[@]}" --no-build-isolation "${sdist[@]}")"
        "$(printf '%q ' "${pip[@]}" "${withdeps[@]}")"
        "$(printf '%q ' env PYTHONPATH="$ROOT" "$venv/bin/python" -m recipe.megatron_check run --work "$work/check" \
            --json "$work/rows.json")"
        "$(printf '%q ' env PYTHONPATH="$ROOT" "$venv/bin/python" -m recipe.megatron_check replay \
            --work "$work/replay" --model "$DEVICE_WHEELS/r3/model" --rollouts "$DEVICE_WHEELS/r3/rollouts.npz" \
            --paths "$DEVICE_WHEELS/r3/paths.npz" --json "$work/replay-rows.json")"
    )
    if (( dry )); then
        printf 'device: %s\n' "${commands[@]}"
        return 0
    fi
    [[ -d "$DEVICE_WHEELS" ]] || die "$DEVICE_WHEELS is missing: run bash scripts/gpu_check.sh --fetch-wheels on a" \
        "machine with PyPI and carry .whl to this one"
    [[ -f "$DEVICE_WHEELS/r3/paths.npz" ]] || die "$DEVICE_WHEELS/r3 (the routes the R3 step replays) is missing:" \
        "run bash scripts/gpu_check.sh --fetch-wheels again on the CPU machine (it records them) and carry .whl"
    local command
    for command in "${commands[@]}"; do
        echo "gpu_check.sh --device: $command" >&2
        eval "$command" || die "failed: $command"
    done
}
