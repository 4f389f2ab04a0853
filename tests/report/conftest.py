"""Two small runs whose metric logs are written by verl's own ``Tracking(default_backend=["file"])``, so the report is
tested against verl 0.9.1's real file-logger format, plus length traces written by ``LengthTraceWriter``.

* ``baseline``: plain verl (no recipe metrics, no traces), steps 1..6, validation at 0, 3, 6.
* ``capped``: recipe run with a cap, crashed after step 4 and resumed from the step-3 checkpoint. verl reopens its
  file with "wb", so the trainer rotated the first segment to ``logs/metrics.1.jsonl`` before the resume. The second
  segment logs validation-before-train at step 3, then redoes step 4 with new values. Its traces are one append-only
  file with a partial line left by the crash and step 4 written twice.

Each launch also leaves Hydra's ``hydra/<stamp>/.hydra/config.yaml`` (written as Hydra 1.3 writes it,
``OmegaConf.to_yaml`` of the unresolved job config): the two runs differ only in the arms' switches and run paths,
and the capped run's resume raised ``trainer.total_epochs`` from 2 to 3 (the baseline's).
"""
from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from omegaconf import OmegaConf

from recipe.traces import LengthTraceWriter

VAL = "val-core/openai/gsm8k/reward/mean@4"
RESPONSE_LENGTH = 4096

BASE_GEN = {1: 10.0, 2: 12.0, 3: 11.0, 4: 30.0, 5: 13.0, 6: 12.0}
BASE_VAL = {0: 0.20, 3: 0.30, 6: 0.35}

# Capped run: first segment (steps 1..4; step 4 is lost work, redone after the resume), then the resumed segment.
CAP_GEN_SEG1 = {1: 8.0, 2: 9.0, 3: 50.0, 4: 99.0}
CAP_GEN_SEG2 = {4: 9.0, 5: 8.0, 6: 10.0}
CAP_GEN = {**CAP_GEN_SEG1, **CAP_GEN_SEG2}
CAP = {1: 0, 2: 3000, 3: 3000, 4: 2500, 5: 2500, 6: 2800}
CAP_VAL_SEG1 = {0: 0.21, 3: 0.40}
CAP_VAL_SEG2 = {3: 0.41, 6: 0.45}
# Responses per step: (dataset_item_idx, sample_index) pairs and lengths; step 4 is traced twice.
TRACE_ROWS = [7, 7, 9, 9]
TRACE_SAMPLES = [0, 1, 0, 1]
TRACE_LENGTHS_SEG1 = {1: [100, 4096, 200, 300], 2: [3000, 120, 3000, 80], 3: [500, 600, 3000, 700], 4: [1, 1, 1, 1]}
TRACE_LENGTHS_SEG2 = {4: [2500, 400, 410, 420], 5: [90, 95, 2500, 2500], 6: [1000, 2800, 1200, 1300]}
TRACE_LENGTHS = {**TRACE_LENGTHS_SEG1, **TRACE_LENGTHS_SEG2}


def launch_config(experiment: str, stamp: str, recipe: bool, total_epochs: int = 3) -> dict:
    """A launch's composed config as scripts/train_grpo.sh sets it (a subset of the real one's keys), with the run
    directory as on the cluster: the report must not depend on where the logs were copied to."""
    run_dir = f"/ckpt/length_aware_grpo/{experiment}"
    return {
        "data": {
            "train_files": "/data/dapo-math-17k.parquet",
            "train_batch_size": 32,
            "shuffle": False,
            "seed": None,
            "sampler": {"class_path": "pkg://recipe.adapter.sampler" if recipe else None, "bucket_size": 1024},
        },
        "actor_rollout_ref": {
            "actor": {"optim": {"lr": 1.0e-6}, "megatron": {"tensor_model_parallel_size": 4}},
            "ref": {"megatron": {"tensor_model_parallel_size":
                                 "${oc.select:actor_rollout_ref.actor.megatron.tensor_model_parallel_size,1}"}},
            "rollout": {"n": 16, "enforce_eager": not recipe, "max_num_seqs": 256},
        },
        "recipe": {"cap": {"enable": int(recipe), "mode": "seed", "factor": 2.0}, "over_sample": {"enable": 0}},
        "trainer": {
            "experiment_name": experiment,
            "default_local_dir": run_dir,
            "logger": ["console", "file"],
            "total_epochs": total_epochs,
        },
        "ray_kwargs": {"ray_init": {"runtime_env": {"env_vars": {
            "VERL_FILE_LOGGER_PATH": f"{run_dir}/logs/metrics.{stamp}.jsonl", "WANDB_DIR": run_dir}}}},
    }


def write_launch_config(run: Path, stamp: str, config: dict) -> Path:
    """Where and how Hydra writes it with hydra.run.dir=<run>/hydra/<stamp>."""
    path = run / "hydra" / stamp / ".hydra" / "config.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(OmegaConf.to_yaml(OmegaConf.create(config)))
    return path


def baseline_metrics(step: int) -> dict:
    gen = BASE_GEN[step]
    return {
        "training/global_step": step,
        "training/epoch": 0,
        "timing_s/gen": gen,
        "timing_s/step": gen + 20.0,
        "perf/throughput": 1000.0 + 10 * step,
        "response_length/mean": 500.0 + 10 * step,
        "response_length/max": 2000.0 + step,
        "response_length/clip_ratio": 0.25 * (step % 2),
        "critic/score/mean": 0.1 * step,
        "critic/rewards/mean": -1.0,
    }


def capped_metrics(step: int, gen: float) -> dict:
    lengths = TRACE_LENGTHS[step]
    cap = CAP[step]
    return {
        "training/global_step": step,
        "timing_s/gen": gen,
        "timing_s/step": gen + 15.0,
        "perf/throughput": 1500.0 + step,
        "response_length/mean": sum(lengths) / len(lengths),
        "response_length/max": float(max(lengths)),
        "response_length/clip_ratio": sum(n >= RESPONSE_LENGTH for n in lengths) / len(lengths),
        "critic/score/mean": 0.2 * step,
        "rollout/response_max_tokens_cap": float(cap),
        "rollout/cap_hit_ratio": sum(cap > 0 and n >= cap for n in lengths) / len(lengths),
        "sampler/epoch": 0,
    }


def write_verl_log(path: Path, records: list[tuple[int, dict]]) -> None:
    """Log through verl's Tracking file backend (the format under test is verl's by construction)."""
    from verl.utils.tracking import Tracking

    path.parent.mkdir(parents=True, exist_ok=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VERL_FILE_LOGGER_PATH", str(path))
        tracking = Tracking(project_name="length_aware_grpo", experiment_name="test", default_backend=["file"])
        for step, data in records:
            tracking.log(data=data, step=step)
        tracking.finish()


def write_traces(writer: LengthTraceWriter, lengths_by_step: dict[int, list[int]]) -> None:
    for step, lengths in lengths_by_step.items():
        writer.append(
            epoch=0,
            step=step,
            cap=CAP[step] or None,
            response_length=RESPONSE_LENGTH,
            gen_time_s=CAP_GEN[step],
            rows=TRACE_ROWS,
            sample_index=TRACE_SAMPLES,
            lengths=lengths,
            predicted=[1000.0, 1000.0, float("nan"), float("nan")],
        )


def capped_segment(first_step: int, gen_times: dict, val: dict) -> list:
    """One launch of the capped run: a validation record at its first step, then one record per training step."""
    records = [(first_step, {VAL: val[first_step]})]
    for step, gen in gen_times.items():
        data = capped_metrics(step, gen)
        if step in val:
            data[VAL] = val[step]
        records.append((step, data))
    return records


@pytest.fixture(scope="session")
def runs_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("runs")

    base = root / "baseline"
    records = [(0, {VAL: BASE_VAL[0]})]
    for step in BASE_GEN:
        data = baseline_metrics(step)
        if step in BASE_VAL:
            data[VAL] = BASE_VAL[step]
            data["val-aux/openai/gsm8k/reward/std@4"] = 0.01
        records.append((step, data))
    write_verl_log(base / "logs" / "metrics.jsonl", records)
    write_launch_config(base, "20250101T000000Z", launch_config("baseline", "20250101T000000Z", recipe=False))

    capped = root / "capped"
    for stamp, epochs in (("20250101T000000Z", 2), ("20250101T060000Z", 3)):
        write_launch_config(capped, stamp, launch_config("capped", stamp, recipe=True, total_epochs=epochs))
    log = capped / "logs" / "metrics.jsonl"
    write_verl_log(log, capped_segment(0, CAP_GEN_SEG1, CAP_VAL_SEG1))
    traces = capped / "length_traces.jsonl"
    with LengthTraceWriter(traces) as w:
        write_traces(w, TRACE_LENGTHS_SEG1)
    with open(traces, "ab") as fp:  # the crash interrupts a trace write
        fp.write(b'{"epoch": 0, "step": 5, "le')

    log.rename(log.with_name("metrics.1.jsonl"))  # the trainer's rotation before verl truncates the file
    write_verl_log(log, capped_segment(3, CAP_GEN_SEG2, CAP_VAL_SEG2))  # validation before train at the resume step
    with LengthTraceWriter(traces) as w:
        write_traces(w, TRACE_LENGTHS_SEG2)

    # Copying logs (e.g. from cloud storage) loses mtimes: make the rotated segment look newest.
    newest = max(f.stat().st_mtime for f in (capped / "logs").iterdir()) + 100
    os.utime(capped / "logs" / "metrics.1.jsonl", (newest, newest))
    # Other JSONL in a run directory (verl's rollout dumps) must not be taken for metrics.
    (capped / "rollout_dump").mkdir()
    (capped / "rollout_dump" / "4.jsonl").write_text('{"input": "q", "output": "a", "score": 1.0, "step": 4}\n')
    return root


@pytest.fixture(scope="session")
def inputs() -> SimpleNamespace:
    """The fixture's inputs and ``write_verl_log`` for tests (with importlib imports a conftest is not importable)."""
    return SimpleNamespace(
        VAL=VAL, BASE_GEN=BASE_GEN, BASE_VAL=BASE_VAL, CAP=CAP, CAP_GEN=CAP_GEN, CAP_VAL_SEG2=CAP_VAL_SEG2,
        TRACE_LENGTHS=TRACE_LENGTHS, write_verl_log=write_verl_log, launch_config=launch_config,
        write_launch_config=write_launch_config,
    )
