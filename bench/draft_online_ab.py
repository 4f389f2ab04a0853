"""Frozen against online EAGLE-3 head on the CPU: does a head that keeps learning keep more of its drafts?

Two launches of the CPU preset (the trained tiny Qwen3-MoE counting down, 18 steps of verl's loop: 3 epochs of 6),
``ROLLOUT_SPECULATIVE=eagle3`` with the tiny head trained offline on the model's own text from random prompts
(``recipe/tiny/eagle3_head.py``, so off the task's distribution, as a published head is off a policy that RL moves),
K=4 draft tokens; they differ only in ``ROLLOUT_DRAFT_ONLINE`` (``frozen``: 0, the head is only pushed back after each
weight sync; ``online``: 1, trained each step on the hidden states captured while drafting,
``recipe/adapter/draft_learning.py``). Same data order and sampling seeds; speculation is lossless, but the random
numbers a response consumes depend on its drafts, so the arms' rollouts (and so their policies) part after the first
draft that differs.

    .venv/bin/python bench/draft_online_ab.py [--out .cache/draft_online_ab] [--seed 0] [--head-lr 1e-3]
        [--report-only]

Prints per step, both arms: tokens per verify step (``rollout/spec_acceptance_length``, vLLM's counters) and the
online head's top-1 on the step's rollouts before it trains on them; the mean over the first and the last epoch;
then writes the A/B report (``scripts/compare_runs.sh``: ``speculation.png`` plots both) and prints the command
that reproduces it. A complete run is kept, so a rerun finishes a partial benchmark. ~5-10 min a run on 2 cores.
"""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from recipe.cpu.preset import CPU_VALUES, N_TRAIN  # noqa: E402
from recipe.report.cpu_launch import has_step, launch_cpu  # noqa: E402
from recipe.report.load import load_run  # noqa: E402
from recipe.report.summary import series  # noqa: E402

ARMS = {"frozen": {"ROLLOUT_DRAFT_ONLINE": "0"}, "online": {"ROLLOUT_DRAFT_ONLINE": "1"}}
CLEARED = ("BASELINE_NO_RESAMPLE", "VLLM_EAGER_BASELINE_NO_RESAMPLE", "MODEL_PATH", "TRAIN_FILE", "TEST_FILE",
           "DISTCP_PATH", "SAVE_CKPT_ENABLE", "MULTI_TURN", "CPU_MODEL", "TOTAL_EPOCHS", "DRAFT_MODEL_PATH")
STEPS_PER_EPOCH = N_TRAIN // int(CPU_VALUES["TRAIN_BATCH_SIZE"])
STEPS = int(CPU_VALUES["TOTAL_EPOCHS"]) * STEPS_PER_EPOCH
TOKENS, TOP1 = "rollout/spec_acceptance_length", "draft_head/top1_before_train"


def complete(run_dir: Path) -> bool:
    return has_step(run_dir, STEPS)


def launch(out: Path, arm: str, seed: int, head_lr: str) -> None:
    env = dict(DATA_SEED=str(seed), ROLLOUT_SAMPLING_SEED=str(seed), ROLLOUT_SPECULATIVE="eagle3", **ARMS[arm])
    if arm == "online":
        env["ROLLOUT_DRAFT_LR"] = head_lr
    drafts = [k for k in os.environ if k.startswith("ROLLOUT_DRAFT_")]  # the arms set their own
    launch_cpu(out, f"{arm}-s{seed}", env, (*CLEARED, *drafts), STEPS, "draft_online_ab")


def report(out: Path, seed: int) -> None:
    runs = {arm: load_run(out / f"{arm}-s{seed}", arm) for arm in ARMS}
    tokens = {arm: series(r, TOKENS) for arm, r in runs.items()}
    top1 = series(runs["online"], TOP1)
    print(f"{'step':>4} | {'frozen tok/step':>15} | {'online tok/step':>15} | {'online head top-1':>17}")
    for step in range(1, STEPS + 1):
        cells = [f"{tokens[a].get(step, float('nan')):15.3f}" for a in ARMS]
        print(f"{step:>4} | " + " | ".join(cells) + f" | {top1.get(step, float('nan')):17.3f}")
    for label, steps in (("first epoch", range(1, STEPS_PER_EPOCH + 1)),
                         ("last epoch", range(STEPS - STEPS_PER_EPOCH + 1, STEPS + 1))):
        means = {a: tokens[a].reindex(list(steps)).mean() for a in ARMS}
        print(f"{label}: tokens per verify step frozen {means['frozen']:.3f}, online {means['online']:.3f} "
              f"(online / frozen {means['online'] / means['frozen']:.3f})")
    report_dir = out / "report"
    subprocess.check_call(["bash", str(ROOT / "scripts" / "compare_runs.sh"), str(out / f"frozen-s{seed}"),
                           str(out / f"online-s{seed}"), "--out", str(report_dir)], cwd=ROOT,
                          stdout=subprocess.DEVNULL)
    print(f"A/B report: {report_dir} (speculation.png)")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / ".cache" / "draft_online_ab")
    ap.add_argument("--seed", type=int, default=0, help="DATA_SEED and ROLLOUT_SAMPLING_SEED of both arms")
    ap.add_argument("--head-lr", default="1e-3", help="ROLLOUT_DRAFT_LR of the online arm (default 1e-3: the tiny "
                    "head; the recipe's default 1e-4 is for a full-size head)")
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args(argv)
    out = args.out.resolve()
    if not args.report_only:
        out.mkdir(parents=True, exist_ok=True)
        for arm in ARMS:
            run_dir = out / f"{arm}-s{args.seed}"
            if complete(run_dir):
                print(f"[draft_online_ab] {run_dir.name}: complete, kept", flush=True)
                continue
            if run_dir.exists():
                shutil.rmtree(run_dir)
            launch(out, arm, args.seed, args.head_lr)
    report(out, args.seed)
    print("reproduce: " + shlex.join([".venv/bin/python", "bench/draft_online_ab.py", "--out", str(args.out),
                                       "--seed", str(args.seed), "--head-lr", args.head_lr]))


if __name__ == "__main__":
    main()
