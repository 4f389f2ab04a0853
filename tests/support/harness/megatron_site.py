"""Running the Megatron check in a subprocess with Megatron's site dir on the path (``scripts/bootstrap_venv.sh``
installs Megatron-Core and Megatron-Bridge there, apart from verl's stack; Megatron's process groups are global to
a process, so each check gets its own)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
SITE = Path(sys.prefix) / "megatron-site"  # requirements/megatron-cpu.txt


def run_with_megatron(cmd: list[str], log: Path, timeout: int = 600, expect_ok: bool = True) -> int:
    """Run ``cmd`` in the repository with the Megatron site dir first on PYTHONPATH, its output to ``log``; fails
    the test with the log's last lines when it exits non-zero (unless ``expect_ok`` is False: a check that must
    fail a row), and names the fix when the site dir is missing. Returns the exit status."""
    import pytest

    if not (SITE / "megatron" / "bridge").is_dir():
        pytest.fail(f"{SITE} has no Megatron-Bridge: run scripts/bootstrap_venv.sh (requirements/megatron-cpu.txt)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SITE), str(REPO), os.environ.get("PYTHONPATH", "")])}
    with log.open("w") as out:
        proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout)
    assert proc.returncode == 0 or not expect_ok, f"{' '.join(cmd[2:5])} exited {proc.returncode}; last lines of " \
        f"{log}:\n" + "\n".join(log.read_text().splitlines()[-25:])
    return proc.returncode
