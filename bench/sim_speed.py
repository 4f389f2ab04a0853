"""How long the simulator takes for one epoch of 1024 prompts x 16 responses (batch 32, response_length 16384).

Reproduce: ``.venv/bin/python bench/sim_speed.py`` (from the repository root). Prints the trace generation time and
the best-of-3 wall time of one epoch per policy (baseline, seed, best, best-onpolicy, oversample-restart,
partial-rollout-unbounded).
"""
from __future__ import annotations

import time

from recipe.sim import trace as T
from recipe.sim.engine import EngineParams
from recipe.sim.run import run_policy

COMMAND = ".venv/bin/python bench/sim_speed.py"


def main() -> None:
    t0 = time.perf_counter()
    trace = T.generate("reference", num_prompts=1024, n=16, epochs=1)
    print(f"generate 1024 x 16 x 1 epoch (calibration included): {time.perf_counter() - t0:.2f} s")
    previous = trace.previous_run()  # what the warm-started best-onpolicy seeds from
    for name in ("baseline", "seed", "best", "best-onpolicy", "oversample-restart", "partial-rollout-unbounded"):
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            run = run_policy(trace, name, EngineParams(), batch_size=32, previous=previous)
            best = min(best, time.perf_counter() - t0)
        print(f"one epoch, {name:25s}: {best:.3f} s for {len(run.steps)} steps "
              f"({len(run.steps) * 32 * 16} responses)")
    print(f"reproduce: {COMMAND}")


if __name__ == "__main__":
    main()
