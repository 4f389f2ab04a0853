"""Learning A/B on the CPU: the recipe's order and cap against verl's random order without a cap, seeds per arm.

Does the recipe still learn? The CPU preset (the trained tiny Qwen3-MoE counting down, 18 steps of verl's loop) in
both arms, several seeds an arm.

    .venv/bin/python bench/learning_ab.py [--seeds 0,1,2] [--out .cache/learning_ab] [--plot PNG] [--epochs 3]
        [--lr 4e-4] [--model trained|random] [--report-only]

Each (seed, arm) is one ``bash scripts/train_grpo.sh`` with ``PRESET=cpu``, run one after the other in
``<out>/<arm>-s<seed>`` (``CKPT_ROOT=<out>``, ``EXPERIMENT_NAME=<arm>-s<seed>``); the seed sets both the data order
(``DATA_SEED``: verl's shuffle in the baseline, the sampler's first epoch and tie-breaks in the recipe) and the
rollout sampling (``ROLLOUT_SAMPLING_SEED``). The arms differ only in ``BASELINE_NO_RESAMPLE=1`` (the fair baseline:
sampler and cap off). A run whose metrics reach its last training step is complete and kept, so a rerun
finishes a partial result; an incomplete run directory is deleted and launched again (with checkpoints off a CPU
run cannot resume). Seeds run in order, both arms of a seed before the next seed, so a cut-short benchmark is
balanced.

Prints, from verl's metrics files (``recipe.report.load``), the reward (``critic/score/mean``) and the validation
score (``val-core/...``) per step as ``mean [min, max] n=seeds`` per arm, the reward per epoch (every prompt once in
both arms, so free of the order's per-step mix of lengths), each arm's final-window mean per seed and the
difference with its standard error; writes the plot (mean line, min-max band) and prints the command that
reproduces it. 3-10 min a run on 2 cores (3 alone, 10 beside the test suite).
"""
from __future__ import annotations

import argparse
import shlex
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from recipe.cpu.preset import COUNTDOWN_VALUES, CPU_VALUES, N_TRAIN  # noqa: E402
from recipe.report.cpu_launch import has_step, launch_cpu  # noqa: E402
from recipe.report.load import load_run  # noqa: E402
from recipe.report.seeds import (  # noqa: E402
    per_seed, plot_arms, render_diff, render_table, reward_key, val_key, window_diff)
from recipe.report.summary import val_label  # noqa: E402

ARMS = {"resampler": {}, "baseline": {"BASELINE_NO_RESAMPLE": "1"}}  # A (the recipe), B (verl's random order)
# Variables this benchmark sets or that would change an arm: taken out of the caller's environment.
CLEARED = ("BASELINE_NO_RESAMPLE", "VLLM_EAGER_BASELINE_NO_RESAMPLE", "MODEL_PATH", "TRAIN_FILE", "TEST_FILE",
           "DISTCP_PATH", "SAVE_CKPT_ENABLE", "MULTI_TURN", "CPU_MODEL", "TOTAL_EPOCHS", "TRAIN_BATCH_SIZE", "ACTOR_LR")
STEPS_PER_EPOCH = N_TRAIN // int(CPU_VALUES["TRAIN_BATCH_SIZE"])
EPOCHS = int(CPU_VALUES["TOTAL_EPOCHS"])


def run_name(arm: str, seed: int, epochs: int = EPOCHS, lr: str | None = None, model: str = "trained") -> str:
    """``<arm>-s<seed>``, with ``-e<epochs>`` / ``-lr<lr>`` / ``-random`` when not the preset's default: runs of
    another setting never count as done."""
    return (f"{arm}-s{seed}" + ("" if epochs == EPOCHS else f"-e{epochs}") + (f"-lr{lr}" if lr else "")
            + ("" if model == "trained" else f"-{model}"))


def is_complete(run_dir: Path, epochs: int = EPOCHS) -> bool:
    """Whether the run's metrics hold a training record of its last step."""
    return has_step(run_dir, epochs * STEPS_PER_EPOCH)


def launch(out: Path, arm: str, seed: int, epochs: int = EPOCHS, lr: str | None = None,
           model: str = "trained") -> float:
    """One CPU-preset run in ``<out>/<run_name>``; returns its wall time. Raises if it fails or stops short."""
    env = dict(DATA_SEED=str(seed), ROLLOUT_SAMPLING_SEED=str(seed), TOTAL_EPOCHS=str(epochs), **ARMS[arm])
    if lr:
        env["ACTOR_LR"] = lr
    if model != "trained":
        env["CPU_MODEL"] = model
    return launch_cpu(out, run_name(arm, seed, epochs, lr, model), env, CLEARED, epochs * STEPS_PER_EPOCH,
                      "learning_ab")


def report(out: Path, seeds: list[int], window: int, plot: Path, epochs: int = EPOCHS, lr: str | None = None,
           model: str = "trained") -> None:
    """Tables, window differences and the plot from every complete run under ``out``."""
    names = {arm: [run_name(arm, s, epochs, lr, model) for s in seeds] for arm in ARMS}
    arms = {arm: [load_run(out / n, n) for n in ns if is_complete(out / n, epochs)] for arm, ns in names.items()}
    missing = [arm for arm, runs in arms.items() if not runs]
    if missing:
        raise SystemExit(f"learning_ab: no complete run of {', '.join(missing)} under {out}: launch them first")
    runs = [r for rs in arms.values() for r in rs]
    a, b = ARMS
    panels = []
    rkey = reward_key(runs)
    if rkey is None:
        raise SystemExit(f"learning_ab: the runs under {out} did not all log critic/score/mean")
    reward = {arm: per_seed(rs, rkey, train_only=True) for arm, rs in arms.items()}
    panels.append((f"training reward per step ({rkey})", reward))
    print(render_table(f"training reward ({rkey})", reward), "\n")
    # An epoch trains every prompt once in both arms, so its mean is free of the order's per-step mix of lengths.
    by_epoch = {arm: f.groupby((f.index - 1) // STEPS_PER_EPOCH).mean() for arm, f in reward.items()}
    print(render_table(f"training reward per epoch (mean of its {STEPS_PER_EPOCH} steps)", by_epoch, "epoch"), "\n")
    print(render_diff(f"reward, last {window} steps", (a, b), window_diff(reward[a], reward[b], window)))
    vkey = val_key(runs)
    if vkey is not None:
        val = {arm: per_seed(rs, vkey) for arm, rs in arms.items()}
        panels.append((f"validation score per step ({val_label(vkey)})", val))
        print("\n" + render_table(f"validation ({vkey})", val), "\n")
        print(render_diff("validation, last", (a, b), window_diff(val[a], val[b], 1)))
        print(render_diff("validation, gain from step 0",
                          (a, b), window_diff(val[a] - val[a].iloc[0], val[b] - val[b].iloc[0], 1)))
    else:
        print("\n(no single val-core/* score logged by every run: no validation table)")
    plot.parent.mkdir(parents=True, exist_ok=True)
    plot_arms(panels).savefig(plot)
    print(f"\nseeds per arm: " + ", ".join(f"{arm} {len(rs)}" for arm, rs in arms.items()) + f"; plot: {plot}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds, each run in both arms (default 0,1,2)")
    ap.add_argument("--out", type=Path, default=ROOT / ".cache" / "learning_ab", help="folder of the run directories")
    ap.add_argument("--plot", type=Path, help="PNG to write (default <out>/learning_ab.png)")
    ap.add_argument("--window", type=int, default=STEPS_PER_EPOCH,
                    help=f"final steps averaged per seed (default {STEPS_PER_EPOCH}: the last epoch)")
    ap.add_argument("--epochs", type=int, default=EPOCHS, help=f"TOTAL_EPOCHS of each run (default the preset's "
                    f"{EPOCHS}, {STEPS_PER_EPOCH} steps an epoch)")
    ap.add_argument("--lr", help=f"ACTOR_LR of each run (default the preset's: {COUNTDOWN_VALUES['ACTOR_LR']} trained, "
                    f"{CPU_VALUES['ACTOR_LR']} random)")
    ap.add_argument("--model", choices=("trained", "random"), default="trained",
                    help="CPU_MODEL: the trained model counting down (default) or the random one on the smoke reward")
    ap.add_argument("--report-only", action="store_true", help="launch nothing: report the complete runs in --out")
    args = ap.parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        ap.error(f"--seeds must be comma-separated integers, e.g. 0,1,2; got {args.seeds!r}")
    if not seeds or min(seeds) < 0:
        ap.error(f"--seeds needs at least one seed >= 0; got {args.seeds!r}")
    if args.epochs < 1:
        ap.error(f"--epochs must be >= 1; got {args.epochs}")
    try:
        if args.lr is not None and not float(args.lr) > 0:
            raise ValueError
    except ValueError:
        ap.error(f"--lr must be a number > 0, e.g. 4e-4; got {args.lr!r}")
    out = args.out.resolve()
    plot = args.plot or out / "learning_ab.png"
    if not args.report_only:
        out.mkdir(parents=True, exist_ok=True)
        for seed in seeds:
            for arm in ARMS:
                run_dir = out / run_name(arm, seed, args.epochs, args.lr, args.model)
                if is_complete(run_dir, args.epochs):
                    print(f"[learning_ab] {run_dir.name}: complete, kept", flush=True)
                    continue
                if run_dir.exists():
                    print(f"[learning_ab] {run_dir.name}: incomplete, deleted and relaunched", flush=True)
                    shutil.rmtree(run_dir)
                launch(out, arm, seed, args.epochs, args.lr, args.model)
    report(out, seeds, args.window, plot, args.epochs, args.lr, args.model)
    cmd = [".venv/bin/python", "bench/learning_ab.py", "--seeds", ",".join(map(str, seeds)), "--out", str(args.out),
           "--window", str(args.window), "--epochs", str(args.epochs)]
    cmd += (["--lr", args.lr] if args.lr else []) + (["--model", args.model] if args.model != "trained" else [])
    cmd += ["--plot", str(args.plot)] if args.plot else []
    print("reproduce: " + shlex.join(cmd))


if __name__ == "__main__":
    main()
