"""The capped agent loop end to end on the real vLLM CPU engine.

verl's Ray-managed vLLMHttpServer needs a GPU; ``EngineServerManager`` stands in for it (it mirrors the server's
``max_tokens`` handling, see recipe/route_record/engine.py). Everything else is real: the agent loop is
instantiated from configs/agent_loops.yaml with hydra exactly as verl's AgentLoopWorker does, rows come from the
recipe dataset, and generation runs on vLLM.
"""
import asyncio
import copy

import hydra
import pytest
from omegaconf import OmegaConf

from recipe.adapter.agent_loop import AGENT_LOOP_NAME, CappedSingleTurnAgentLoop
from recipe.adapter.fields import CAP
from recipe.route_record.config import RESPONSE_LENGTH, build_agent_loop, compose_recipe
from recipe.route_record.engine import EngineServerManager

pytestmark = pytest.mark.engine


def test_agent_loops_yaml_registers_the_capped_loop_as_verl_loads_it(recipe_config):
    entries = OmegaConf.load(recipe_config.actor_rollout_ref.rollout.agent.agent_loop_config_path)
    # the single-turn loop, and the multi-turn one under its own name and verl's (tests/adapter/test_tool_agent_loop.py)
    assert [e.name for e in entries] == [AGENT_LOOP_NAME, "length_capped_tool_agent", "tool_agent"]
    assert recipe_config.actor_rollout_ref.rollout.agent.default_agent_loop == AGENT_LOOP_NAME
    assert hydra.utils.get_class(entries[0]._target_) is CappedSingleTurnAgentLoop


def test_caps_stop_exactly_and_shared_params_are_untouched(vllm_engine, tiny_artifacts, tmp_path):
    from transformers import AutoTokenizer

    from recipe.adapter.dataset import LengthAwareRLHFDataset

    cfg = compose_recipe(tiny_artifacts, [f"trainer.default_local_dir={tmp_path}"])
    tok = AutoTokenizer.from_pretrained(tiny_artifacts.model_dir)
    dataset = LengthAwareRLHFDataset(data_files=str(tiny_artifacts.train_parquet), tokenizer=tok, config=cfg.data)
    rows = [{k: v for k, v in dataset[i].items() if k != "dummy_tensor"} for i in range(6)]
    caps = [3, 17, 40, 0, RESPONSE_LENGTH, RESPONSE_LENGTH + 100]  # 0 / >= response_length: no cap
    for row, cap in zip(rows, caps):
        row[CAP] = cap
    rollout = cfg.actor_rollout_ref.rollout
    shared = dict(temperature=1.0, top_p=1.0, top_k=-1, repetition_penalty=1.0, logprobs=False, ignore_eos=True)
    before = copy.deepcopy(shared)
    server = EngineServerManager(vllm_engine, prompt_length=rollout.prompt_length,
                                 response_length=rollout.response_length)

    async def run_all():
        loop = build_agent_loop(cfg, server, tok)  # the same instantiate call as AgentLoopWorker._run_agent_loop
        assert isinstance(loop, CappedSingleTurnAgentLoop)
        return await asyncio.gather(*(loop.run(shared, **row) for row in rows))

    outputs = vllm_engine.run(run_all(), timeout=300)
    lengths = [len(o.response_ids) for o in outputs]
    assert lengths == [3, 17, 40, RESPONSE_LENGTH, RESPONSE_LENGTH, RESPONSE_LENGTH]
    assert shared == before  # one dict shared by all rows (as verl shares it across a prompt's n runs)
