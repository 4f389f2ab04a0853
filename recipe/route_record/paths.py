"""Rollouts recorded through the recipe's agent loops on every path that changes what a trajectory's routes cover
(routing replay, R3): single-turn, a capped response, one cut by an abort (as the tail cut or over-sampling cut it),
one resumed by over-sample ``continue`` after a stored first part, and a finished session handed back from the
store; multi-turn (the trained tiny model calling the calculator), a trajectory with tool replies between its
assistant turns, and the same trajectory handed back from the store. Each comes out as verl's worker receives it
(``AgentLoopOutput`` with ``routed_experts``); the routing-replay tests compare them with the model's own routing
(``tests/adapter/test_routes_engine.py``) and replay them in Megatron-Core (``tests/megatron/test_router_replay.py``).

The engine must capture routes (``enable_return_routed_experts``); the server stand-in returns them as verl's does
with ``enable_rollout_routing_replay``. A stored response is served to the loop's ``fetch_partial`` in place of
TransferQueue's read.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from unittest import mock

import numpy as np

from recipe.adapter.fields import CAP, PARTIAL
from recipe.adapter.partial import PartialRef, StoredResponse
from recipe.route_record.config import build_agent_loop, compose_recipe
from recipe.route_record.engine import EngineServerManager, ForcedLengths, InProcessVLLM

PATHS = ("capped", "cut", "resumed", "finished")
MULTI_TURN_PATHS = ("tool-turns", "tool-turns-finished")
TOOL_ROWS = 8  # calculator prompts sampled until one trajectory has a tool reply between assistant turns
CAP_TOKENS = 9  # the capped response, and the stored first part of the resumed ones
CUT_AFTER_STEPS = 8  # engine steps before the abort: the cut responses hold a few tokens, far from their limit
PARAMS = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}


@dataclass
class PathRecord:
    path: str
    prompt: list[int]
    response: list[int]
    mask: list[int]
    logprobs: list[float]
    routes: np.ndarray  # (rows, layers, top_k): vLLM's layout, prompt + response - 1 rows when whole
    requests: int  # server requests the run made (a finished session's routes cost one prefill)


class _Counting:
    """A server client that counts its requests."""

    def __init__(self, inner):
        self.inner, self.requests = inner, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def generate(self, request_id, **kw):
        self.requests += 1
        return await self.inner.generate(request_id, **kw)


def model_routes(model, token_ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """A transformers Qwen3-MoE's own routing of ``token_ids`` (one forward): each MoE layer's top-k ids as its gate
    returns them (what transformers' experts then use), sorted per token, ``(tokens, layers, k)``; and per token and
    layer the gap between the k-th and (k+1)-th router logit (how close a different top-k was)."""
    import torch

    gates = [layer.mlp.gate for layer in model.model.layers]
    seen = {}
    hooks = [gate.register_forward_hook(lambda _m, _in, out, i=i: seen.__setitem__(i, out))
             for i, gate in enumerate(gates)]
    try:
        with torch.no_grad():
            model(torch.tensor([token_ids]))
    finally:
        for hook in hooks:
            hook.remove()
    k = model.config.num_experts_per_tok
    ids = torch.stack([seen[i][2] for i in range(len(gates))], dim=1).sort(-1).values
    logits = torch.stack([seen[i][0] for i in range(len(gates))], dim=1).sort(-1, descending=True).values
    return ids.numpy(), (logits[..., k - 1] - logits[..., k]).numpy()


def replay_config(artifacts, tmp_path, *overrides):
    return compose_recipe(artifacts, [f"trainer.default_local_dir={tmp_path}",
                                      "actor_rollout_ref.rollout.enable_rollout_routing_replay=True", *overrides])


def _record(path, out, requests) -> PathRecord:
    return PathRecord(path, list(out.prompt_ids), list(out.response_ids), list(out.response_mask),
                      list(out.response_logprobs or []), out.routed_experts, requests)


async def _run(cfg, tokenizer, server, row, tools=None, **fields):
    loop = build_agent_loop(cfg, server, tokenizer, tools=tools)
    return await loop.run(PARAMS, **row, **fields)


def record_paths(engine: InProcessVLLM, cfg, tokenizer, rows: list[dict]) -> list[PathRecord]:
    """One response per path (``PATHS``) on ``rows[0..2]`` (the resumed and finished ones continue ``rows[0]``'s
    capped response), with the routes the recipe's loop returns."""
    rollout = cfg.actor_rollout_ref.rollout
    sizes = {"prompt_length": rollout.prompt_length, "response_length": rollout.response_length,
             "routing_replay": True, "global_steps": 0}

    def server(cls):
        return _Counting(cls(engine, **sizes))

    async def capped():
        s = server(EngineServerManager)
        out = await _run(cfg, tokenizer, s, rows[0], **{CAP: CAP_TOKENS, "session_id": 0})
        return _record("capped", out, s.requests)

    async def cut():
        s = server(ForcedLengths)
        start = engine.scheduler_steps()
        run = asyncio.ensure_future(_run(cfg, tokenizer, s, rows[1], **{CAP: rollout.response_length,
                                                                         "session_id": 0}))
        while engine.scheduler_steps() < start + CUT_AFTER_STEPS and not run.done():
            await asyncio.sleep(0.01)
        await engine.abort_all()
        return _record("cut", await run, s.requests)

    async def resumed(first: PathRecord, complete: bool):
        stored = StoredResponse(tokens=first.response, logprobs=first.logprobs)

        async def fetch(ref, session, turns=False):
            return stored

        ref = PartialRef(key_prefix="u", partition_id="train", complete=[complete], min_version=0, resumes=1,
                         has_logprobs=True)
        s = server(EngineServerManager)
        with mock.patch("recipe.adapter.agent_loop.fetch_partial", fetch):
            out = await _run(cfg, tokenizer, s, rows[0], **{CAP: 0, PARTIAL: ref.to_json(), "session_id": 0})
        return _record("finished" if complete else "resumed", out, s.requests)

    async def all_paths():
        first = await capped()
        return [first, await cut(), await resumed(first, complete=False), await resumed(first, complete=True)]

    return engine.run(all_paths(), timeout=300)


def record_single_turn(engine: InProcessVLLM, artifacts, work) -> list[PathRecord]:
    """``PATHS`` on the tiny model's train rows 3 and 4, through the recipe's config with routing replay on (its
    files under ``work``): what the engine and the Megatron routing-replay tests both read."""
    from transformers import AutoTokenizer

    from recipe.adapter.dataset import LengthAwareRLHFDataset

    cfg = replay_config(artifacts, work)
    tok = AutoTokenizer.from_pretrained(artifacts.model_dir)
    dataset = LengthAwareRLHFDataset(data_files=str(artifacts.train_parquet), tokenizer=tok, config=cfg.data)
    rows = [{k: v for k, v in dataset[i].items() if k != "dummy_tensor"} for i in (3, 4)]
    return record_paths(engine, cfg, tok, rows)


def multi_turn_config(sft_model_dir, tmp_path, tool_config, *overrides):
    """The multi-turn preset's agent loop (the recipe's tool loop, hermes calls) on the trained tiny model."""
    from recipe.adapter.tool_agent_loop import TOOL_AGENT_LOOP_NAME
    from recipe.tiny import sft as tiny_sft

    class Paths:
        model_dir = sft_model_dir
        train_parquet = tiny_sft.build_calculator_parquet(tmp_path / "train.parquet", 4, 0, "train")
        test_parquet = tiny_sft.build_calculator_parquet(tmp_path / "test.parquet", 4, 0, "test")

    return replay_config(Paths, tmp_path, "data.max_response_length=128",
                         "actor_rollout_ref.rollout.multi_turn.enable=True",
                         f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tool_config}",
                         "actor_rollout_ref.rollout.multi_turn.format=hermes",
                         f"actor_rollout_ref.rollout.agent.default_agent_loop={TOOL_AGENT_LOOP_NAME}", *overrides)


def record_multi_turn(engine: InProcessVLLM, cfg, tokenizer, tools) -> list[PathRecord]:
    """``MULTI_TURN_PATHS``: calculator prompts at temperature 1 until a trajectory has a tool reply (mask 0) between
    trained tokens; then that trajectory handed back from the store as a finished session of a resumed group."""
    import random

    from recipe.tiny import tasks

    rollout = cfg.actor_rollout_ref.rollout
    sizes = {"prompt_length": rollout.prompt_length, "response_length": rollout.response_length,
             "routing_replay": True, "global_steps": 0}
    rng = random.Random(0)

    def row(i):
        return {"raw_prompt": [{"role": "user", "content": tasks.tool_problem(rng)[0]}], "session_id": i,
                "tools_kwargs": {}}

    def has_tool_reply(out) -> bool:
        mask = list(out.response_mask)
        return 0 in mask and 1 in mask[mask.index(0):]

    async def go():
        server = _Counting(EngineServerManager(engine, **sizes))
        outs = await asyncio.gather(*(_run(cfg, tokenizer, server, row(i), tools) for i in range(TOOL_ROWS)))
        out = next((o for o in outs if has_tool_reply(o)), None)
        if out is None:
            raise AssertionError(f"none of {TOOL_ROWS} calculator trajectories had a tool reply between turns")
        turns = _record("tool-turns", out, 0)
        stored = StoredResponse(tokens=turns.response, logprobs=turns.logprobs, prompt=turns.prompt, mask=turns.mask,
                                num_turns=out.num_turns, metrics=dict(out.metrics),
                                extra_fields=dict(out.extra_fields))

        async def fetch(ref, session, turns=False):
            return stored

        ref = PartialRef(key_prefix="u", partition_id="train", complete=[True], min_version=0, resumes=1,
                         has_logprobs=True)
        again = _Counting(EngineServerManager(engine, **sizes))
        with mock.patch("recipe.adapter.tool_agent_loop.fetch_partial", fetch):
            back = await _run(cfg, tokenizer, again, row(0), tools, **{PARTIAL: ref.to_json()})
        return [turns, _record("tool-turns-finished", back, again.requests)]

    return engine.run(go(), timeout=300)


def record_tool_turns(work) -> tuple:
    """``MULTI_TURN_PATHS`` recorded on the trained tiny model (its own engine, capturing routes; the calculator of
    ``recipe/tools/configs/calculator.yaml``): ``(model_dir, records)``. ``work``: a directory for the config's files."""
    from pathlib import Path

    from transformers import AutoTokenizer
    from verl.tools.tool_registry import load_all_tools

    from recipe.tiny import sft as tiny_sft

    model_dir = tiny_sft.sft_artifacts().model_dir
    tool_config = Path(__file__).resolve().parents[1] / "tools" / "configs" / "calculator.yaml"
    cfg = multi_turn_config(model_dir, Path(work), tool_config)
    engine = InProcessVLLM(model_dir, max_model_len=1024, max_num_seqs=8, seed=0, enable_return_routed_experts=True)
    try:
        return model_dir, record_multi_turn(engine, cfg, AutoTokenizer.from_pretrained(model_dir),
                                            load_all_tools(str(tool_config), None))
    finally:
        engine.shutdown()


def save_paths(path, records: list[PathRecord]) -> None:
    """``records`` as ``python -m recipe.megatron_check replay --paths`` reads them."""
    from recipe.megatron_check.replay import Rollout, save_rollouts

    save_rollouts(path, [Rollout.of_agent_loop(r.prompt, r.response, r.routes, r.logprobs, r.mask) for r in records],
                  names=[r.path for r in records])
