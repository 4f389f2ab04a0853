#!/usr/bin/env bash
# Install what the Python tool's local sandbox needs: Debian's bubblewrap (bwrap). Idempotent; never fatal.
# Called by scripts/test.sh before pytest. Without root or apt-get it says why and exits 0: the sandbox tests then
# skip with sandbox_self_check's reason (docs/tools.md), and training can use SANDBOX_BACKEND=sandbox_fusion.
set -uo pipefail

if command -v bwrap >/dev/null 2>&1; then
    echo "[sandbox] bubblewrap present: $(bwrap --version 2>/dev/null || echo bwrap)" >&2
    exit 0
fi
if [[ "$(id -u)" != "0" ]]; then
    echo "[sandbox] bubblewrap is not installed and this is not root: run 'sudo apt-get install -y bubblewrap'" \
        "(the sandbox tests will skip)" >&2
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "[sandbox] bubblewrap is not installed and there is no apt-get: install bubblewrap with this system's" \
        "package manager (the sandbox tests will skip)" >&2
    exit 0
fi
echo "[sandbox] installing bubblewrap (apt-get)" >&2
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y -q bubblewrap >/dev/null 2>&1; then
    # An empty or stale package list: refresh it once.
    apt-get update -q >/dev/null 2>&1 || true
    if ! apt-get install -y -q bubblewrap >/dev/null 2>&1; then
        echo "[sandbox] 'apt-get install bubblewrap' failed (the sandbox tests will skip)" >&2
        exit 0
    fi
fi
echo "[sandbox] bubblewrap installed: $(bwrap --version 2>/dev/null)" >&2
