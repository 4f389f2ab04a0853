"""Sampler cost on the driver: re-ordering an epoch and folding one step into the estimates.

    python bench/sampler.py [--rows 1000000] [--update-rows 512] [--n 16] [--repeat 7]

Prints one line per measurement and, last, ``reorder_1m_rows_s=<float> update_512_rows_ms=<float>`` (medians over
--repeat runs; goals on a 2-core machine: < 1 s and < 5 ms). ``update`` folds --update-rows rows x --n responses
(one step of --update-rows prompts with GRPO groups of n) into estimates of a --rows-row dataset.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from recipe.core.estimates import LengthEstimates
from recipe.core.ordering import EpochPlan


def median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--update-rows", type=int, default=512)
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)

    est = LengthEstimates(args.rows, ema_decay=0.7)
    est.update(np.arange(args.rows), rng.lognormal(8.3, 0.8, args.rows))  # every row seen: a sorted epoch
    plan = EpochPlan(est, batch_size=args.batch_size, bucket_size=1024, shuffle_batch_blocks=True, seed=0)
    reorder_s = median_time(plan.start_next_epoch, args.repeat)
    assert plan.sorted_epoch and len(plan.order) == args.rows

    rows = np.repeat(rng.choice(args.rows, args.update_rows, replace=False), args.n)
    lengths = rng.lognormal(8.3, 0.8, len(rows))
    censored = rng.random(len(rows)) < 0.05
    update_ms = 1000 * median_time(lambda: est.update(rows, lengths, censored), args.repeat)

    print(f"reorder: {args.rows} rows, bucket 1024, block shuffle of {args.batch_size}: {reorder_s:.3f} s (median of "
          f"{args.repeat})")
    print(f"update: {args.update_rows} rows x n={args.n} responses into {args.rows} estimates: {update_ms:.3f} ms")
    print(f"reproduce: {sys.executable} bench/sampler.py --rows {args.rows} --update-rows {args.update_rows} "
          f"--n {args.n} --repeat {args.repeat}")
    print(f"reorder_1m_rows_s={reorder_s:.4f} update_512_rows_ms={update_ms:.4f}")


if __name__ == "__main__":
    main()
