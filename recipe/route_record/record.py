"""Record what the R3 replay check reads (``python -m recipe.megatron_check replay``): the tiny Qwen3-MoE, three
rollouts sampled on vLLM CPU with their routes and log-probs (``rollouts.npz``), and one response per single-turn
recipe path through the recipe's agent loop (``paths.npz``, :mod:`recipe.route_record.paths`).

``tests/megatron/test_router_replay.py`` replays them on the CPU; ``bash scripts/gpu_check.sh --fetch-wheels`` writes
them beside the device wheels (``.whl/r3``) so that ``--device`` replays them on a lent GPU, which has no vLLM. Needs
the CPU stack (vLLM CPU). Usage: ``python -m recipe.route_record OUT_DIR``.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

_rng = np.random.default_rng(1)
PROMPTS = [[int(t) for t in _rng.integers(3, 900, n)] for n in (7, 23, 41)]
LENGTHS = [32, 24, 40]


def record(out: Path, artifacts=None, engine=None, paths=None) -> Path:
    """Write ``model/`` (a copy of the tiny model), ``rollouts.npz`` and ``paths.npz`` into ``out``; returns ``out``.
    ``engine``: an ``InProcessVLLM`` on ``artifacts``' model with routed-expert capture on (the test session's), used
    and left running; without it one is started for the recording and shut down. ``paths``: the single-turn paths
    already recorded on that engine (:func:`recipe.route_record.paths.record_single_turn`), else recorded here."""
    from recipe.megatron_check.replay import Rollout, save_rollouts
    from recipe.route_record.paths import record_single_turn, save_paths
    from recipe.tiny.artifacts import tiny_artifacts
    from recipe.route_record.engine import InProcessVLLM

    artifacts = artifacts or tiny_artifacts()
    out.mkdir(parents=True, exist_ok=True)
    own = engine is None
    if own:
        engine = InProcessVLLM(artifacts.model_dir, max_model_len=512, max_num_seqs=8, seed=0,
                               enable_return_routed_experts=True)
    try:
        outputs = engine.run(engine.generate_forced(PROMPTS, LENGTHS, temperature=1.0, logprobs=0))
        if paths is None:
            paths = record_single_turn(engine, artifacts, out / "run-config")
    finally:
        if own:
            engine.shutdown()
    save_rollouts(out / "rollouts.npz", [Rollout.of_vllm(o) for o in outputs])
    save_paths(out / "paths.npz", paths)
    shutil.rmtree(out / "run-config", ignore_errors=True)
    shutil.copytree(artifacts.model_dir, out / "model", dirs_exist_ok=True)
    return out
