"""Cost of the preflight's duplicate-prompt check on a file the size of the published DAPO-Math-17k parquet.

    .venv/bin/python bench/data_checks.py [--unique 17917] [--copies 100] [--repeat 3] [--keep PATH]

Writes a verl RL parquet shaped like DAPO-Math-17k (prompt = one user message: DAPO's template around a generated
~300-character problem; data_source, ability, reward_model and extra_info with a uuid per row), --unique problems
each repeated --copies times in a shuffled order, then times ``recipe.data_checks.duplicate_share`` on it. Prints the
file's size, the result and, last, ``duplicate_share_s=<median> rows=<n>`` (goal: a few seconds on 2 cores).
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recipe.data_checks import duplicate_share

PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'
WORDS = "let triangle integer sum find positive real number the of such that and with circle area points".split()


def write_dapo_like(path: Path, unique: int, copies: int, seed: int = 0) -> int:
    rng = np.random.default_rng(seed)
    problems = [
        f"Problem {i}: " + " ".join(rng.choice(WORDS, 45)) + f" ${rng.integers(1, 10**6)}$?" for i in range(unique)
    ]
    messages = pa.array([[{"content": PREFIX + p + SUFFIX, "role": "user"}] for p in problems])
    answers = pa.array([str(a) for a in rng.integers(0, 10**4, unique)])
    order = pa.array(rng.permutation(np.repeat(np.arange(unique), copies)))
    rows = len(order)
    table = pa.table(
        {
            "data_source": pa.array(["math_dapo"] * rows),
            "prompt": messages.take(order),
            "ability": pa.array(["MATH"] * rows),
            "reward_model": pa.StructArray.from_arrays(
                [answers.take(order), pa.array(["rule-lighteval/MATH_v2"] * rows)], names=["ground_truth", "style"]
            ),
            "extra_info": pa.StructArray.from_arrays([pa.array([str(uuid.uuid4()) for _ in range(rows)])], ["index"]),
        }
    )
    pq.write_table(table, path)
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--unique", type=int, default=17_917)
    ap.add_argument("--copies", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", type=Path, help="write the generated file here (default: a temporary directory)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = args.keep or Path(tmp) / "dapo_like.parquet"
        t = time.perf_counter()
        n = write_dapo_like(path, args.unique, args.copies)
        print(f"wrote {n:,} rows ({path.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - t:.1f} s")
        times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            result = duplicate_share(path, "prompt")
            times.append(time.perf_counter() - t)
        rows, unique, share = result
        assert (rows, unique) == (n, args.unique), result
        rounded = [round(x, 2) for x in times]
        print(f"duplicate_share: rows={rows:,} unique={unique:,} share={share:.4f}; times {rounded} s")
        print(f"duplicate_share_s={statistics.median(times):.2f} rows={rows}")


if __name__ == "__main__":
    main()
