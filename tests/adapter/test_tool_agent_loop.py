"""CappedToolAgentLoop against a scripted server: the budget per turn, seeds, priority, aborts and the rollout gate.

The loop is built from configs/agent_loops.yaml with hydra and verl's tools from recipe/tools/configs/calculator.yaml
through verl's own ``load_all_tools``, as verl's AgentLoopWorker builds them; the tokenizer is the trained tiny
model's (its chat template renders tools and tool replies). Only the server is scripted: each turn returns the
tokens of a given text. The slow-tool tests run a real bubblewrap process (skipped with the reason where bwrap cannot
run) and check it is gone after the gate closes.
"""
import asyncio
import json
import subprocess
import time
from pathlib import Path

import hydra
import pytest
from omegaconf import OmegaConf

from recipe.adapter.fields import CAP, PARTIAL, SEED
from recipe.adapter.rollout_gate import GateState, GateWatch
from recipe.adapter.tool_agent_loop import TOOL_AGENT_LOOP_NAME, CappedToolAgentLoop
from recipe.core.seeds import turn_seed
from recipe.testing import tiny_sft
from recipe.testing import tiny_tasks as tasks
from recipe.testing.recipe_config import compose_recipe

REPO = Path(__file__).resolve().parents[2]
CALC_CONFIG = REPO / "recipe" / "tools" / "configs" / "calculator.yaml"
CALL = tasks.tool_call_text("12*7+3")
ANSWER = "The answer is 87. #### 87"


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return tiny_sft.build_tool_tokenizer()


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir)


def compose(tokenizer_dir, tmp_path, tool_config=CALC_CONFIG, response_length=64):
    class Paths:
        model_dir = tokenizer_dir
        train_parquet = tiny_sft.build_calculator_parquet(tmp_path / "train.parquet", 4, 0, "train")
        test_parquet = tiny_sft.build_calculator_parquet(tmp_path / "test.parquet", 4, 0, "test")

    return compose_recipe(Paths, [
        f"data.max_response_length={response_length}",
        "actor_rollout_ref.rollout.multi_turn.enable=True",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tool_config}",
        "actor_rollout_ref.rollout.multi_turn.format=hermes",
        f"actor_rollout_ref.rollout.agent.default_agent_loop={TOOL_AGENT_LOOP_NAME}",
    ])


class ScriptedServer:
    """verl's server client for one trajectory: turn i returns ``turns[i]`` (text, stop reason); records each call."""

    def __init__(self, tokenizer, turns, tool_delay_s=0.0):
        self.tokenizer, self.turns, self.calls = tokenizer, list(turns), []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        self.calls.append({"prompt_ids": list(prompt_ids), "sampling_params": dict(sampling_params), **kwargs})
        text, stop = self.turns.pop(0)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if stop == "completed" and text == ANSWER:
            ids.append(self.tokenizer.convert_tokens_to_ids(tasks.IM_END))
        ids = ids[: sampling_params.get("max_tokens", len(ids))]
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), stop_reason=stop,
                           extra_fields={"global_steps": 0})


def make_loop(cfg, tokenizer, server, tools):
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap

    from recipe.adapter.dataset import LengthAwareRLHFDataset

    entry = next(e for e in OmegaConf.load(cfg.actor_rollout_ref.rollout.agent.agent_loop_config_path)
                 if e.name == TOOL_AGENT_LOOP_NAME)
    return hydra.utils.instantiate(entry, trainer_config=DictConfigWrap(config=cfg), server_manager=server,
                                   tokenizer=tokenizer, processor=None, hf_model_type="qwen3_moe",
                                   dataset_cls=LengthAwareRLHFDataset, data_config=DictConfigWrap(cfg.data),
                                   tools=ToolListWrap(tools))


def load_tools(path):
    from verl.tools.tool_registry import load_all_tools

    return load_all_tools(tool_config_path=str(path), function_tool_path=None)


def row(**fields):
    question, _, _ = tasks.tool_problem(__import__("random").Random(0))
    return {"raw_prompt": [{"role": "user", "content": question}], "session_id": 1, "tools_kwargs": {}, **fields}


def run_loop(cfg, tokenizer, server, tools, params, **kwargs):
    """Build the loop inside the event loop that runs it (verl's loops bind to the loop they are built in)."""

    async def go():
        return await make_loop(cfg, tokenizer, server, tools).run(params, **kwargs)

    return asyncio.run(go())


def test_agent_loops_yaml_registers_the_tool_loop_under_both_names(tokenizer_dir, tmp_path):
    cfg = compose(tokenizer_dir, tmp_path)
    entries = {e.name: e for e in OmegaConf.load(cfg.actor_rollout_ref.rollout.agent.agent_loop_config_path)}
    assert hydra.utils.get_class(entries[TOOL_AGENT_LOOP_NAME]._target_) is CappedToolAgentLoop
    assert hydra.utils.get_class(entries["tool_agent"]._target_) is CappedToolAgentLoop  # verl's name, ours


def test_each_turn_asks_for_what_is_left_of_the_budget_with_its_own_seed_and_the_priority(
        tokenizer_dir, tokenizer, tmp_path):
    cfg = compose(tokenizer_dir, tmp_path)
    server = ScriptedServer(tokenizer, [(CALL, "completed"), (ANSWER, "completed")])
    out = run_loop(cfg, tokenizer, server, load_tools(CALC_CONFIG), {"temperature": 1.0, "logprobs": True},
                   priority=-7, **row(**{CAP: 48, SEED: 11}))

    assert [c["priority"] for c in server.calls] == [-7, -7]
    assert [c["sampling_params"]["seed"] for c in server.calls] == [turn_seed(11, 1, 0), turn_seed(11, 1, 1)]
    assert turn_seed(11, 1, 0) != turn_seed(11, 1, 1)
    first, second = server.calls
    assert first["sampling_params"]["max_tokens"] == 48
    mask = out.response_mask
    # the second turn's prompt is the whole context so far; it asks for the budget minus every response token so far
    consumed = len(second["prompt_ids"]) - len(first["prompt_ids"])
    assert second["sampling_params"]["max_tokens"] == 48 - consumed
    assert len(out.response_ids) == len(mask) <= 48
    text = tokenizer.decode(out.response_ids)
    assert "<tool_response>\n87\n</tool_response>" in text and text.rstrip().endswith(f"{ANSWER}{tasks.IM_END}")
    # assistant tokens 1, the tool reply (and its turn markers) 0
    tool_part = [m for m, t in zip(mask, out.response_ids) if m == 0]
    assert tool_part and "87" in tokenizer.decode([t for m, t in zip(mask, out.response_ids) if m == 0])
    assert sum(mask) == len(tokenizer.encode(CALL, add_special_tokens=False)) + len(
        tokenizer.encode(ANSWER, add_special_tokens=False)) + 1
    assert out.num_turns == 4  # user, assistant, tool, assistant


def test_a_tool_reply_that_uses_up_the_budget_ends_the_trajectory_without_another_turn(
        tokenizer_dir, tokenizer, tmp_path):
    cfg = compose(tokenizer_dir, tmp_path)
    n_call = len(tokenizer.encode(CALL, add_special_tokens=False))
    server = ScriptedServer(tokenizer, [(CALL, "completed"), (ANSWER, "completed")])
    out = run_loop(cfg, tokenizer, server, load_tools(CALC_CONFIG), {"temperature": 1.0}, **row(**{CAP: n_call + 3}))
    assert len(server.calls) == 1
    assert len(out.response_ids) <= n_call + 3


def test_an_aborted_turn_is_kept_but_never_parsed_and_runs_no_tool(tokenizer_dir, tokenizer, tmp_path):
    cfg = compose(tokenizer_dir, tmp_path)
    server = ScriptedServer(tokenizer, [(CALL, "aborted"), (ANSWER, "completed")])
    out = run_loop(cfg, tokenizer, server, load_tools(CALC_CONFIG), {"temperature": 1.0}, **row())
    assert len(server.calls) == 1
    assert out.response_mask == [1] * len(out.response_ids)  # no tool reply was added
    assert tokenizer.decode(out.response_ids) == CALL


def test_verls_tool_agent_loop_runs_the_tool_of_an_aborted_turn(tokenizer_dir, tokenizer, tmp_path):
    """Why the override exists: verl's loop parses the aborted turn and runs its tool."""
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop

    from recipe.adapter.dataset import LengthAwareRLHFDataset

    cfg = compose(tokenizer_dir, tmp_path)
    server = ScriptedServer(tokenizer, [(CALL, "aborted"), (ANSWER, "completed")])

    async def go():
        loop = ToolAgentLoop(trainer_config=DictConfigWrap(config=cfg), server_manager=server, tokenizer=tokenizer,
                             processor=None, hf_model_type="qwen3_moe", dataset_cls=LengthAwareRLHFDataset,
                             data_config=DictConfigWrap(cfg.data), tools=ToolListWrap(load_tools(CALC_CONFIG)))
        return await loop.run({"temperature": 1.0}, **row())

    out = asyncio.run(go())
    assert len(server.calls) == 2 and 0 in out.response_mask


def test_a_partial_rollout_row_is_refused_by_name(tokenizer_dir, tokenizer, tmp_path):
    cfg = compose(tokenizer_dir, tmp_path)
    ref = json.dumps({"key_prefix": "u", "partition_id": "train", "complete": [False], "min_version": 0,
                      "resumes": 1, "has_logprobs": False})
    with pytest.raises(ValueError, match="OVER_SAMPLE_REQUEUE=restart"):
        run_loop(cfg, tokenizer, ScriptedServer(tokenizer, []), load_tools(CALC_CONFIG), {"temperature": 1.0},
                 **row(**{PARTIAL: ref}))


# ---------------------------------------------------------------- the rollout gate, with a real sandboxed tool


@pytest.fixture()
def slow_tool_config(tmp_path):
    from recipe.tools.sandbox import sandbox_self_check

    err = sandbox_self_check("bubblewrap")
    if err is not None:
        pytest.skip(f"bubblewrap sandbox unavailable here: {err}")
    from recipe.testing.slow_tool import slow_tool_config

    path = slow_tool_config(tmp_path, latency_s=60.0)
    return path, tmp_path / "tool_events.jsonl"


def bwrap_processes() -> int:
    r = subprocess.run(["pgrep", "-c", "-x", "bwrap"], capture_output=True, text=True)
    return int(r.stdout.strip() or 0)


def no_bwrap_within(seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while bwrap_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    return bwrap_processes() == 0


def test_closing_the_gate_cancels_a_running_tool_and_kills_its_process(
        tokenizer_dir, tokenizer, tmp_path, slow_tool_config, monkeypatch):
    path, events = slow_tool_config
    cfg = compose(tokenizer_dir, tmp_path, tool_config=path)
    server = ScriptedServer(tokenizer, [(CALL, "completed"), (ANSWER, "completed")])
    tools = load_tools(path)
    assert no_bwrap_within(5)  # the skip check's sandbox has gone

    async def scenario():
        state = GateState()
        watch = GateWatch(state)

        async def local_watch():
            return watch

        monkeypatch.setattr("recipe.adapter.tool_agent_loop.gate_watch", local_watch)
        loop = make_loop(cfg, tokenizer, server, tools)
        task = asyncio.ensure_future(loop.run({"temperature": 1.0}, **row()))
        while not (events.exists() and events.read_text()):
            await asyncio.sleep(0.05)
        while bwrap_processes() == 0:  # the sandbox is up
            await asyncio.sleep(0.05)
        t0 = time.monotonic()
        state.set(True)
        out = await asyncio.wait_for(task, timeout=10)
        watch.stop()
        return out, time.monotonic() - t0

    out, elapsed = asyncio.run(scenario())
    assert elapsed < 3  # not the tool's 60 s
    assert len(server.calls) == 1  # no turn after the cancelled tool
    assert out.response_mask == [1] * len(out.response_ids)
    assert [json.loads(line)["event"] for line in events.read_text().splitlines()] == ["start", "cancelled"]
    assert no_bwrap_within(5)


def test_a_closed_gate_starts_no_new_turn_and_no_tool(tokenizer_dir, tokenizer, tmp_path, monkeypatch):
    cfg = compose(tokenizer_dir, tmp_path)

    async def scenario():
        state = GateState()
        state.set(True)
        watch = GateWatch(state)
        await asyncio.sleep(0)  # the watch's first poll sees the closed gate

        async def local_watch():
            return watch

        monkeypatch.setattr("recipe.adapter.tool_agent_loop.gate_watch", local_watch)
        server = ScriptedServer(tokenizer, [(CALL, "completed"), (ANSWER, "completed")])
        out = await make_loop(cfg, tokenizer, server, load_tools(CALC_CONFIG)).run({"temperature": 1.0}, **row())
        watch.stop()
        return server, out

    server, out = asyncio.run(scenario())
    assert server.calls == [] and out.response_ids == []
