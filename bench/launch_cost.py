"""What one launch of the CPU preset costs, and where: wall time, time to the first training step, and CPU seconds
by process (verl's Ray actors, the vLLM server, engine core and worker, the driver, the preflight), with ``--parallel
N`` launches side by side. This is the measurement behind docs/testing.md's account of the suite's time: a launch is
mostly verl's start-up, and on 2 cores two side by side share the CPU rather than fill idle time.

Reproduce: ``.venv/bin/python bench/launch_cost.py [--parallel 1|2] [--out DIR]`` (with ``scripts/lib/cpu_env.sh``
sourced, as ``scripts/test.sh`` does; ~5 min for one launch on 2 cores). Each launch is ``bash scripts/train_grpo.sh``
with no variables but ``CKPT_ROOT`` (the CPU preset, 18 steps). CPU time is sampled from ``/proc`` every 0.5 s for
every process carrying the launch's marker (``harness.cpu_runs``), so a process's last half second before it
exits is missed.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))  # the e2e launcher (test harness)
from harness.cpu_runs import Launcher, marked_pids  # noqa: E402

HZ = os.sysconf("SC_CLK_TCK")
FIRST_STEP = "[recipe] step 1/"


def cpu_seconds(pid: int) -> tuple[str, float] | None:
    """(process name, user + system CPU seconds so far), or None if it is gone. A plain Python process is named by
    what it runs (``python -m recipe.main``, a Ray helper script), the others by their own name (Ray actors rename
    themselves ``ray::<Actor>``)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    name, fields = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
    if name.startswith("python"):
        name = f"python {python_target([a.decode(errors='replace') for a in argv[1:] if a])}"
    return name, (int(fields[11]) + int(fields[12])) / HZ


def python_target(args: list[str]) -> str:
    """``-m MODULE``, ``-c``, or the script's file name, from a Python command line's arguments."""
    for i, arg in enumerate(args):
        if arg == "-m" and i + 1 < len(args):
            return f"-m {args[i + 1]}"
        if arg == "-c":
            return "-c"
        if not arg.startswith("-"):
            return Path(arg).name
    return ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parallel", type=int, default=1, help="launches side by side (default 1)")
    ap.add_argument("--out", type=Path, default=None, help="where the runs write (default: a new temp dir)")
    args = ap.parse_args()
    if args.parallel < 1:
        raise SystemExit(f"--parallel {args.parallel}: give at least 1")
    launcher = Launcher(args.out or Path(tempfile.mkdtemp(prefix="launch-cost-")))
    t0 = time.monotonic()
    procs = [launcher.start(f"run-{i}")[0] for i in range(args.parallel)]
    seen: dict[int, tuple[str, float]] = {}  # pid -> (name, CPU seconds at the last sample)
    first_step: dict[int, float] = {}
    ended: dict[int, tuple[float, int]] = {}
    try:
        while len(ended) < len(procs):
            for i, proc in enumerate(procs):
                for pid in marked_pids(proc.marker):
                    if (sample := cpu_seconds(pid)) is not None:
                        seen[pid] = sample
                if i not in first_step and FIRST_STEP in proc.log_path.read_text(errors="replace"):
                    first_step[i] = time.monotonic() - t0
                if i not in ended and proc.poll() is not None:
                    ended[i] = (time.monotonic() - t0, proc.returncode)
            time.sleep(0.5)
    finally:
        launcher.cleanup()
    by_name: dict[str, list[float]] = collections.defaultdict(list)
    for name, cpu in seen.values():
        by_name[name].append(cpu)
    print(f"{args.parallel} launch(es) of the CPU preset side by side, {os.cpu_count()} cores; runs in {launcher.base}")
    for i in range(len(procs)):
        wall, code = ended[i]
        print(f"run-{i}: exit {code}, wall {wall:.0f} s, first training step at {first_step.get(i, float('nan')):.0f} s")
    total = sum(sum(v) for v in by_name.values())
    print(f"CPU seconds, all launches: {total:.0f} ({total / max(w for w, _ in ended.values()):.2f} cores on average)")
    for name, cpus in sorted(by_name.items(), key=lambda kv: -sum(kv[1])):
        if sum(cpus) >= 1.0:
            print(f"  {sum(cpus):7.1f} s  {name} (x{len(cpus)})")
    print(f"reproduce: .venv/bin/python bench/launch_cost.py --parallel {args.parallel}")


if __name__ == "__main__":
    main()
