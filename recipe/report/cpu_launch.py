"""The CPU-preset launches the benchmarks compare (bench/learning_ab.py, bench/draft_online_ab.py): one
``bash scripts/train_grpo.sh`` per arm in ``<out>/<name>``, kept once its metrics reach the last step."""
from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from .load import RunLogsError, load_run
from .summary import training_steps

ROOT = Path(__file__).resolve().parents[2]


def has_step(run_dir: Path, step: int) -> bool:
    """Whether the run's metrics hold a training record of ``step``."""
    try:
        return step in training_steps(load_run(run_dir))
    except RunLogsError:
        return False


def launch_cpu(out: Path, name: str, env: Mapping[str, str], cleared: Iterable[str], last_step: int,
               tag: str) -> float:
    """``PRESET=cpu`` with ``env`` over the caller's environment less ``cleared``, in ``<out>/<name>``
    (``CKPT_ROOT=<out>``, ``EXPERIMENT_NAME=<name>``), its output in ``<out>/<name>.launch.log``; returns its wall
    time. Exits naming the log if it fails or stops before ``last_step``."""
    cleared = set(cleared)
    full = {k: v for k, v in os.environ.items() if k not in cleared}
    full.update(PRESET="cpu", CKPT_ROOT=str(out), EXPERIMENT_NAME=name, **env)
    log = out / f"{name}.launch.log"
    print(f"[{tag}] launching {name} (log {log})", flush=True)
    t0 = time.monotonic()
    with open(log, "w") as fp:
        rc = subprocess.call(["bash", str(ROOT / "scripts" / "train_grpo.sh")], env=full, cwd=ROOT, stdout=fp,
                             stderr=subprocess.STDOUT)
    wall = time.monotonic() - t0
    if rc != 0 or not has_step(out / name, last_step):
        raise SystemExit(f"{tag}: {name} failed (exit {rc}) or stopped before step {last_step}: see {log}; rerun the "
                         "same command to relaunch it (complete runs are kept)")
    print(f"[{tag}] {name} done in {wall / 60:.1f} min", flush=True)
    return wall
