"""Running the recipe's main command (or a control driver) for real, from tests: each run in its own session, with a
hard time limit, every process it started found by a marker in its environment and killed when it ends.

Used by ``tests/e2e`` (verl's real loop on the CPU preset). A run is ``bash scripts/train_grpo.sh`` with
``CKPT_ROOT=<base>/<name>``; :class:`Run` reads what it left: verl's file-logger metrics, the recipe's length traces,
the console output. :class:`RunPool` runs a session's runs in the background, a few at a time. A launch whose Ray
cluster failed to start (``RAY_START_FAILED``: nothing of verl or the recipe ran) is launched once more, and says so.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[3]
# A hung run is a failed test, but a loaded 2-core machine is slow: in a fresh-clone .ci/run beside a busy process,
# the first launch (beside the trained model's build and the other tests, 21.7 GB of 24 in use) took 13 min to its
# first step and 18 to its end, past the 900 s this was.
RUN_TIMEOUT_S = int(os.environ.get("RECIPE_E2E_RUN_TIMEOUT_S", "1800"))
MARKER = "RECIPE_E2E_RUN"
# The CPU preset on its random model, for checks that read the composed config and not the model: built in seconds,
# where the default trained one takes ~8 CPU-minutes in a fresh clone.
CPU_RANDOM = {"PRESET": "cpu", "CPU_MODEL": "random"}
# Ray's own start-up giving up in the driver's ray.init, before verl or the recipe runs: its raylet must register
# within a fixed 30 s and aborts when its metrics agent is slow to start, which a 2-core machine loaded by the rest
# of the suite occasionally makes happen (seen once in a fresh-clone .ci/run).
RAY_START_FAILED = "The current node timed out during startup"
KILL_WAIT_S = 120.0  # how long a run's processes get to exit after SIGKILL (kill_marked)
LINGER_WAIT_S = 600.0  # at the session's end, for a process that outlived KILL_WAIT_S (Launcher.reap)


def marked_pids(marker: str) -> list[int]:
    """Processes whose environment carries ``MARKER=marker`` (everything a run started inherits it)."""
    needle = f"{MARKER}={marker}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        pids.append(int(entry))
            except OSError:
                pass
    return pids


def describe_pids(pids: list[int]) -> list[str]:
    """``pid name (state)`` of each, from /proc (why a process outlives SIGKILL: D is a wait in the kernel)."""
    out = []
    for pid in pids:
        try:
            fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()[:3])
            out.append(f"{pid} {fields['Name'].strip()} ({fields['State'].strip()})")
        except (OSError, KeyError, ValueError):
            out.append(f"{pid} (gone)")
    return out


def kill_marked(marker: str, sig=signal.SIGKILL, wait_s: float = KILL_WAIT_S) -> list[int]:
    """Signal every process of a run; returns the ones still alive after ``wait_s``. It ends on the second empty scan
    half a second after the first: a process caught in ``exec`` shows an empty environment for a moment (the kernel
    sets it up after the parent already saw the exec succeed). ``wait_s`` is generous: a killed vLLM worker freeing
    its KV cache under memory pressure outlived 30 s once (gone a minute later), and once 2 min
    (:meth:`Launcher.reap`)."""
    deadline, empty = time.monotonic() + wait_s, 0
    while True:
        pids = marked_pids(marker)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        empty = 0 if pids else empty + 1
        if empty == 2 or time.monotonic() > deadline:
            return pids
        time.sleep(0.5)


@dataclass
class Run:
    ckpt_root: Path
    experiment: str
    returncode: int | None
    output: str
    killed: "Killed | None" = None  # the first launch, when the run was killed and relaunched

    @property
    def run_dir(self) -> Path:
        return self.ckpt_root / self.experiment

    def metrics(self) -> dict[int, dict]:
        """verl's file logger, every launch of the run: training step -> metrics (a later launch's step wins). The
        validation before training, which verl logs as step 0, is left out."""
        by_step: dict[int, dict] = {}
        for path in sorted((self.run_dir / "logs").glob("metrics.*.jsonl")):
            for line in path.read_text().splitlines():
                if line.strip():
                    rec = json.loads(line)
                    if int(rec["step"]) > 0:
                        by_step.setdefault(int(rec["step"]), {}).update(rec["data"])
        return dict(sorted(by_step.items()))

    def traces(self) -> dict[int, dict]:
        from recipe.traces import read_records

        return read_records(self.run_dir / "length_traces.jsonl")

    def abort_events(self) -> list[dict]:
        """The over-sample driver's event per aborted group (``recipe.over_sample.abort_events=1``); none without."""
        path = self.run_dir / "over_sample_events.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@dataclass
class Killed:
    output: str
    traces: dict  # step -> trace record, as the killed launch left them
    checkpoint: int  # the global step it is resumed from
    steps_after_checkpoint: list  # steps it completed after that checkpoint


def wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


class Launcher:
    def __init__(self, base: Path):
        self.base = base
        self.markers: list[str] = []
        self.procs: list[subprocess.Popen] = []
        self.closed = False
        self.lingering: set[str] = set()  # markers of runs with a process still exiting after SIGKILL (reap)
        self._lock = threading.Lock()  # a start and the clean-up do not interleave (runs start from pool threads)

    def env(self, ckpt_root: Path, marker: str, extra: dict) -> dict:
        # a user's environment, plus the suite's one setting for this machine (tests/conftest.py: no ISA probe per engine)
        keep = ("HOME", "LANG", "TMPDIR", "PATH", "RECIPE_FIXTURE_CACHE", "RECIPE_VENV", "TORCHINDUCTOR_VEC_ISA_OK")
        env = {k: v for k, v in os.environ.items() if k in keep}
        # the whole console (verl's lines too: the tests read "Resuming from ..."), unless a run asks for the quiet one
        # the harness for verl's workers (the slow tool is loaded by class path), the checkout's packages first
        path = os.pathsep.join([str(REPO), str(REPO / "tests" / "support")])
        return {**env, "CKPT_ROOT": str(ckpt_root), MARKER: marker, "RECIPE_CONSOLE": "full", "PYTHONPATH": path,
                **extra}

    def start(self, name: str, extra: dict | None = None, args: tuple = (), cmd: list | None = None
              ) -> tuple[subprocess.Popen, Path, str]:
        """Start ``bash scripts/train_grpo.sh ARGS`` (or ``cmd``) in its own session with ``CKPT_ROOT=<base>/name``."""
        with self._lock:
            if self.closed:
                raise RuntimeError(f"launcher closed (the session is ending): {name} not started")
            ckpt_root = self.base / name
            ckpt_root.mkdir(parents=True, exist_ok=True)
            marker = f"{name}-{uuid.uuid4().hex[:8]}"
            self.markers.append(marker)
            log = open(ckpt_root / f"launch-{len(list(ckpt_root.glob('launch-*.out'))) + 1}.out", "w")
            proc = subprocess.Popen(cmd or ["bash", str(REPO / "scripts" / "train_grpo.sh"), *args], cwd=REPO,
                                    env=self.env(ckpt_root, marker, extra or {}), stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            self.procs.append(proc)
        proc.log_path, proc.marker = Path(log.name), marker
        return proc, ckpt_root, marker

    def wait(self, proc: subprocess.Popen, timeout_s: float = RUN_TIMEOUT_S) -> int | None:
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None
        finally:
            self.reap(proc.marker)

    def reap(self, marker: str) -> None:
        """SIGKILL every process of a run. One still there after :func:`kill_marked`'s wait has the signal and is in
        the kernel's exit path (under load a vLLM worker of a run that had ended well stayed in state R for over
        2 min): not a failure of the run's results, but it must be gone by the session's end, when :meth:`cleanup`
        waits for it again and returns it if not."""
        left = kill_marked(marker)
        if left:
            self.lingering.add(marker)
            print(f"{marker}: still exiting {KILL_WAIT_S:.0f} s after SIGKILL: {describe_pids(left)} "
                  "(checked again at the session's end)", file=sys.stderr, flush=True)

    def run_command(self, name: str, cmd: list, extra: dict, experiment: str) -> Run:
        """A command other than the main one (a control driver), with the same time limit and clean-up."""
        return self.run(name, extra, cmd=cmd, experiment=experiment)

    def start_again_if_ray_failed(self, proc: subprocess.Popen, name: str, extra: dict | None, args: tuple = (),
                                  cmd: list | None = None) -> subprocess.Popen | None:
        """A new launch of the same command when ``proc`` ended because Ray failed to start (nothing of the run had
        started; its log stays as launch-N.out), once per run; else None."""
        if proc.returncode in (0, None) or getattr(proc, "ray_retry", False):
            return None
        if RAY_START_FAILED not in proc.log_path.read_text():
            return None
        print(f"{name}: Ray failed to start ({proc.log_path.name}: {RAY_START_FAILED!r}); launching it once more",
              file=sys.stderr, flush=True)
        again, _, _ = self.start(name, extra, args, cmd)
        again.ray_retry = True
        return again

    def run(self, name: str, extra: dict | None = None, args: tuple = (), experiment: str | None = None,
            cmd: list | None = None) -> Run:
        proc, ckpt_root, _ = self.start(name, extra, args, cmd)
        code = self.wait(proc)
        again = self.start_again_if_ray_failed(proc, name, extra, args, cmd)
        if again is not None:
            proc, code = again, self.wait(again)
        output = proc.log_path.read_text()
        if experiment is None:
            dirs = [p.name for p in ckpt_root.iterdir() if p.is_dir()]
            experiment = dirs[0] if len(dirs) == 1 else "?"
        return Run(ckpt_root, experiment, code, output)

    def kill_and_relaunch(self, name: str, extra: dict, *, experiment: str, checkpoint: int) -> Run:
        """Launch, SIGKILL every process of the run once ``global_step_<checkpoint>`` is the latest checkpoint and a
        step after it is traced (as a node failure would), then relaunch the same command to the end.

        The kill may land anywhere before the next checkpoint (a window of ``save_freq - 1`` steps): waiting for one
        exact step gave a window of one step, which a loaded machine's polling missed (the run then went to its end
        unkilled). A checkpoint past ``checkpoint`` before the kill fails the launch by name."""
        from recipe.traces import read_records

        proc, ckpt_root, _ = self.start(name, extra)
        run_dir = ckpt_root / experiment
        tracker, traces = run_dir / "latest_checkpointed_iteration.txt", run_dir / "length_traces.jsonl"

        def ready() -> bool:
            nonlocal proc
            if proc.poll() is not None:
                kill_marked(proc.marker)
                again = self.start_again_if_ray_failed(proc, name, extra)
                if again is None:
                    raise AssertionError(
                        f"the run ended before it could be killed:\n{proc.log_path.read_text()[-4000:]}")
                proc = again
                return False
            saved = tracker.read_text().strip() if tracker.is_file() else ""
            if saved.isdigit() and int(saved) > checkpoint:
                raise AssertionError(f"global_step_{saved} was written before the kill: no step after "
                                     f"global_step_{checkpoint} was seen traced in between (polled every 0.5 s)")
            return saved == str(checkpoint) and traces.is_file() and max(read_records(traces), default=0) > checkpoint

        wait_for(ready, RUN_TIMEOUT_S, f"global_step_{checkpoint} and a step after it")
        kill_marked(proc.marker)
        self.wait(proc, timeout_s=60)
        left = read_records(traces)
        killed = Killed(proc.log_path.read_text(), left, checkpoint, sorted(s for s in left if s > checkpoint))
        run = self.run(name, extra, experiment=experiment)
        run.killed = killed
        return run

    def cleanup(self) -> list[str]:
        """Refuse further launches and kill every process of every run started (a run's waits then return): each
        launch's own process group (its session: this also catches a launch started a moment ago, whose marker may
        not be readable yet), then everything carrying its marker (Ray and vLLM start processes in other groups).
        Returns the processes still alive after that (a leak: the session fails on it)."""
        with self._lock:
            self.closed = True
        for proc in self.procs:
            if proc.poll() is None:  # not reaped: its pid, the group's id, cannot have been reused
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        left = []
        for marker in self.markers:
            pids = kill_marked(marker, wait_s=LINGER_WAIT_S if marker in self.lingering else KILL_WAIT_S)
            left += [f"{marker}: {p}" for p in describe_pids(pids)]
        return left


class RunPool:
    """A session's runs, started in the background when the session starts, at most ``slots`` at a time, in the
    order submitted (put the longest first), while the session's other tests run. A test asks for a run's
    :class:`Run` with :meth:`result`, which waits for it (and raises what the run raised).

    Measured on a 2-core machine: two runs alone side by side took 461 s, one after the other 566 s
    (``bench/launch_cost.py``); but the whole suite with two at a time beside the other tests took 23.6 min against
    22.3 one after the other, since all of it together is CPU-bound there. More slots pay on machines with more
    cores."""

    def __init__(self, launcher: Launcher, slots: int):
        if slots < 1:
            raise ValueError(f"RunPool needs at least one slot, got {slots}")
        self.launcher = launcher
        self._executor = ThreadPoolExecutor(max_workers=slots, thread_name_prefix="e2e-run")
        self._futures: dict[str, Future] = {}

    def submit(self, name: str, job: Callable[[Launcher], Run]) -> None:
        self._futures[name] = self._executor.submit(job, self.launcher)

    def result(self, name: str) -> Run:
        if name not in self._futures:
            raise KeyError(f"run {name!r} was not submitted; submitted: {sorted(self._futures)}")
        return self._futures[name].result()

    def close(self) -> list[str]:
        """Drop the runs not started, kill the ones running, and wait for their threads; returns the processes of
        any run still alive (:meth:`Launcher.cleanup`)."""
        for future in self._futures.values():
            future.cancel()
        left = self.launcher.cleanup()
        self._executor.shutdown(wait=True)
        return left


def require_success(run: Run) -> Run:
    assert run.returncode == 0, f"run failed ({run.returncode}); last output:\n{run.output[-6000:]}"
    return run
