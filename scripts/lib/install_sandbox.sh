#!/usr/bin/env bash
# Install what the Python tool's local sandbox needs: Debian's bubblewrap (bwrap, >= 0.8.0: --disable-userns and
# --seccomp), libseccomp2 (the seccomp filter, through PyPI's pyseccomp), and numpy and sympy for the sandbox's
# interpreter (/usr/bin/python3: ReTool-style programs import them; the syscall allowlist's corpus runs them).
# Idempotent; never fatal.
# Called by scripts/test.sh before pytest. Without root or apt-get it says why and exits 0: the sandbox tests then
# skip where bwrap is missing, unless CI=true or RECIPE_REQUIRE_SANDBOX=1 make that a failure (docs/tools.md); a
# bwrap that is present but fails the self-check always fails them. Training can use SANDBOX_BACKEND=sandbox_fusion.
set -uo pipefail

want="bubblewrap"
[[ -e /usr/lib/x86_64-linux-gnu/libseccomp.so.2 || -e /usr/lib/aarch64-linux-gnu/libseccomp.so.2 ]] \
    || ldconfig -p 2>/dev/null | grep -q 'libseccomp\.so\.2' || want="$want libseccomp2"
/usr/bin/python3 -c 'import numpy, sympy' 2>/dev/null || want="$want python3-numpy python3-sympy"
if command -v bwrap >/dev/null 2>&1 && [[ "$want" == "bubblewrap" ]]; then
    echo "[sandbox] bubblewrap present: $(bwrap --version 2>/dev/null || echo bwrap)" >&2
    help="$(bwrap --help 2>&1)"
    for opt in --disable-userns --seccomp; do
        grep -q -- "$opt" <<<"$help" || echo "[sandbox] this bwrap lacks $opt: the sandbox refuses to run with it;" \
            "install bubblewrap >= 0.8.0 (Debian 12's) or point SANDBOX_BWRAP at one" >&2
    done
    exit 0
fi
if [[ "$(id -u)" != "0" ]]; then
    echo "[sandbox] $want not installed and this is not root: run 'sudo apt-get install -y $want'" >&2
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "[sandbox] $want not installed and there is no apt-get: install it with this system's package manager" >&2
    exit 0
fi
echo "[sandbox] installing $want (apt-get)" >&2
export DEBIAN_FRONTEND=noninteractive
# shellcheck disable=SC2086  # $want is a list of package names
if ! apt-get install -y -q $want >/dev/null 2>&1; then
    # An empty or stale package list: refresh it once.
    apt-get update -q >/dev/null 2>&1 || true
    # shellcheck disable=SC2086
    if ! apt-get install -y -q $want >/dev/null 2>&1; then
        echo "[sandbox] 'apt-get install $want' failed" >&2
        exit 0
    fi
fi
echo "[sandbox] bubblewrap installed: $(bwrap --version 2>/dev/null)" >&2
