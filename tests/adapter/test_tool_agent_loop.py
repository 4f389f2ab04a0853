"""CappedToolAgentLoop against a scripted server: the budget per turn, seeds, priority, aborts, the rollout gate and
resuming a cut trajectory (over-sample ``continue``).

The loop is built from configs/agent_loops.yaml with hydra and verl's tools from recipe/tools/configs/calculator.yaml
through verl's own ``load_all_tools``, as verl's AgentLoopWorker builds them; the tokenizer is the trained tiny
model's (its chat template renders tools and tool replies). Only the server is scripted: each turn returns the tokens
of a given text (or the given token ids). The slow-tool tests run a real bubblewrap process (skipped only where bwrap
is absent and not required: ``harness.sandbox_check``) and check it is gone after the gate closes. The resume
tests store a cut run's output as verl's worker puts it into TransferQueue and serve it to ``fetch_partial`` in place
of TransferQueue's read.
"""
import asyncio
import json
import os
import time
from pathlib import Path

import hydra
import numpy as np
import pytest
from omegaconf import OmegaConf

from recipe.adapter.fields import CAP, PARTIAL, ROLLOUT_STEP, SEED
from recipe.adapter.partial import RESUME_AT, STALE, PartialRef
from recipe.adapter.rollout_gate import GateState, GateWatch
from recipe.adapter.tool_agent_loop import GENERATE, TOOL_AGENT_LOOP_NAME, TOOLS, CappedToolAgentLoop
from recipe.adapter.turns import TOOL_CALLS
from recipe.core.seeds import turn_seed
from recipe.tiny import sft as tiny_sft
from recipe.tiny import tasks
from harness.proc_tree import named_below
from recipe.route_record.config import build_agent_loop, compose_recipe

REPO = Path(__file__).resolve().parents[2]
CALC_CONFIG = REPO / "recipe" / "tools" / "configs" / "calculator.yaml"
CALL = tasks.tool_call_text("12*7+3")
ANSWER = "The answer is 87. #### 87"
STEP = 7  # the training step the rows are launched for (rollout_step)
R3_SHAPE = (2, 2)  # layers x top-k of the routes the scripted server returns with ``routes=True``


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return tiny_sft.build_tool_tokenizer()


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir)


def compose(tokenizer_dir, tmp_path, tool_config=CALC_CONFIG, response_length=64, extra=(), model=None):
    class Paths:
        model_dir = model or tokenizer_dir
        train_parquet = tiny_sft.build_calculator_parquet(tmp_path / "train.parquet", 4, 0, "train")
        test_parquet = tiny_sft.build_calculator_parquet(tmp_path / "test.parquet", 4, 0, "test")

    return compose_recipe(Paths, [
        f"data.max_response_length={response_length}",
        "actor_rollout_ref.rollout.multi_turn.enable=True",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tool_config}",
        "actor_rollout_ref.rollout.multi_turn.format=hermes",
        f"actor_rollout_ref.rollout.agent.default_agent_loop={TOOL_AGENT_LOOP_NAME}",
        *extra,
    ])


class ScriptedServer:
    """verl's server client for one trajectory: turn i returns ``turns[i]`` (text or token ids, stop reason), with
    ``logprob`` per token and the policy ``version`` (as verl's client reports it); records each call."""

    def __init__(self, tokenizer, turns, logprob=-0.5, version=0, routes=False):
        self.tokenizer, self.turns, self.calls = tokenizer, list(turns), []
        self.logprob, self.version, self.routes = logprob, version, routes

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        self.calls.append({"request_id": request_id, "prompt_ids": list(prompt_ids),
                           "sampling_params": dict(sampling_params), **kwargs})
        # past the script: a routes re-prefill (R3), one token asked for
        text, stop = self.turns.pop(0) if self.turns else ([0], "completed")
        ids = list(text) if isinstance(text, list) else self.tokenizer.encode(text, add_special_tokens=False)
        if stop == "completed" and text == ANSWER:
            ids.append(self.tokenizer.convert_tokens_to_ids(tasks.IM_END))
        ids = ids[: sampling_params.get("max_tokens", len(ids))]
        v = self.version
        # with ``routes``, a route row for every forwarded token (vLLM's layout; the layers x top-k of R3_MODEL)
        routes = np.ones((len(prompt_ids) + len(ids) - 1, *R3_SHAPE), np.uint8) if self.routes else None
        return TokenOutput(token_ids=ids, log_probs=[self.logprob] * len(ids), stop_reason=stop, routed_experts=routes,
                           extra_fields={"global_steps": v, "min_global_steps": v, "max_global_steps": v})


def make_loop(cfg, tokenizer, server, tools):
    return build_agent_loop(cfg, server, tokenizer, name=TOOL_AGENT_LOOP_NAME, tools=tools)


def load_tools(path):
    from verl.tools.tool_registry import load_all_tools

    return load_all_tools(tool_config_path=str(path), function_tool_path=None)


def row(step=STEP, **fields):
    """A training row launched for ``step`` (as the trainer's ``_next_train_batch`` makes it); None: a validation row,
    which carries no step."""
    question, _, _ = tasks.tool_problem(__import__("random").Random(0))
    launched = {ROLLOUT_STEP: step} if step is not None else {}
    return {"raw_prompt": [{"role": "user", "content": question}], "session_id": 1, "tools_kwargs": {}, **launched,
            **fields}


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
    assert out.extra_fields[TOOL_CALLS] == 0  # the call ran but its reply never joined the trajectory


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


# ---------------------------------------------------------------- the rollout gate, with a real sandboxed tool


@pytest.fixture()
def slow_tool_config(tmp_path):
    from harness.sandbox_check import require_sandbox
    from harness.slow_tool import slow_tool_config

    require_sandbox("bubblewrap")

    path = slow_tool_config(tmp_path, latency_s=60.0)
    return path, tmp_path / "tool_events.jsonl"


async def no_actor():
    return None


async def local_gate_watch(monkeypatch, closed_for: int | None = None) -> tuple[GateState, GateWatch]:
    """A gate (closed for step ``closed_for``, None: open) and a watch on it, handed to the loop in place of the Ray
    actor's (stop the watch after the run); ``state.close(STEP)`` closes it as the driver's abort does."""
    state = GateState()
    if closed_for is not None:
        state.close(closed_for)
    watch = GateWatch(state, no_actor)
    if closed_for is not None:
        await watch.wait_cut(closed_for)  # the watch's first poll has seen the gate as it is

    async def local_watch():
        return watch

    monkeypatch.setattr("recipe.adapter.tool_agent_loop.gate_watch", local_watch)
    return state, watch


def bwrap_processes() -> int:
    """bwrap processes under this one: the e2e launches running beside the suite have their own."""
    return len(named_below(os.getpid(), "bwrap"))


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
        state, watch = await local_gate_watch(monkeypatch)
        loop = make_loop(cfg, tokenizer, server, tools)
        task = asyncio.ensure_future(loop.run({"temperature": 1.0}, **row()))
        while not (events.exists() and events.read_text()):
            await asyncio.sleep(0.05)
        while bwrap_processes() == 0:  # the sandbox is up
            await asyncio.sleep(0.05)
        t0 = time.monotonic()
        state.close(STEP)
        out = await asyncio.wait_for(task, timeout=45)
        watch.stop()
        return out, time.monotonic() - t0

    out, elapsed = asyncio.run(scenario())
    assert elapsed < 30  # not the tool's 60 s (seconds here; the margin is for a loaded machine)
    assert len(server.calls) == 1  # no turn after the cancelled tool
    assert out.response_mask == [1] * len(out.response_ids)
    assert [json.loads(line)["event"] for line in events.read_text().splitlines()] == ["start", "cancelled"]
    assert no_bwrap_within(5)


def test_a_gate_closed_for_the_rows_step_starts_no_new_turn_and_no_tool(tokenizer_dir, tokenizer, tmp_path,
                                                                          monkeypatch):
    cfg = compose(tokenizer_dir, tmp_path)

    async def scenario():
        _, watch = await local_gate_watch(monkeypatch, closed_for=STEP)
        server = ScriptedServer(tokenizer, [(CALL, "completed"), (ANSWER, "completed")])
        out = await make_loop(cfg, tokenizer, server, load_tools(CALC_CONFIG)).run({"temperature": 1.0}, **row())
        watch.stop()
        return server, out

    server, out = asyncio.run(scenario())
    assert server.calls == [] and out.response_ids == [] and out.extra_fields[TOOL_CALLS] == 0


@pytest.mark.parametrize("step", [STEP + 1, None], ids=["next step", "validation"])
def test_a_gate_closed_for_another_step_cuts_nothing(tokenizer_dir, tokenizer, tmp_path, monkeypatch, step):
    """A worker's view still closed for step STEP (the open has not reached it) neither stops the next step's
    trajectory nor a validation row's (no step): both run whole, tool call included."""
    cfg = compose(tokenizer_dir, tmp_path)

    async def scenario():
        _, watch = await local_gate_watch(monkeypatch, closed_for=STEP)
        server = ScriptedServer(tokenizer, [(CALL, "completed"), (ANSWER, "completed")])
        out = await make_loop(cfg, tokenizer, server, load_tools(CALC_CONFIG)).run({"temperature": 1.0},
                                                                                  **row(step=step))
        watch.stop()
        return server, out

    server, out = asyncio.run(scenario())
    assert len(server.calls) == 2 and out.extra_fields[TOOL_CALLS] == 1
    assert "<tool_response>\n87\n</tool_response>" in tokenizer.decode(out.response_ids)


class HeldSource:
    """The gate actor as a worker's long poll meets it, stepped by hand: each reply is the gate as it was when the
    actor answered, and it reaches the watch only when the test calls ``release()`` (a reply in flight)."""

    def __init__(self, state):
        self.state, self.polls, self.answers = state, 0, 0
        self._release, self._cv = asyncio.Semaphore(0), asyncio.Condition()

    async def wait_change(self, version):
        await self._count("polls")
        reply = await self.state.wait_change(version)
        await self._count("answers")
        await self._release.acquire()
        return reply

    async def _count(self, name):
        async with self._cv:
            setattr(self, name, getattr(self, name) + 1)
            self._cv.notify_all()

    def release(self):
        self._release.release()

    async def polled(self, n):
        """Until the watch's n-th poll has started: it has applied every reply before it."""
        async with self._cv:
            await self._cv.wait_for(lambda: self.polls >= n)

    async def answered(self, n):
        """Until the actor has answered n polls (the n-th reply may still be held)."""
        async with self._cv:
            await self._cv.wait_for(lambda: self.answers >= n)


def held_gate(monkeypatch, state):
    """A watch on ``state`` through a ``HeldSource``, handed to the loop in place of the Ray actor's."""
    source = HeldSource(state)
    watch = GateWatch(source, no_actor)

    async def local_watch():
        return watch

    monkeypatch.setattr("recipe.adapter.tool_agent_loop.gate_watch", local_watch)
    return source, watch


async def run_one(cfg, tokenizer, **fields):
    server = ScriptedServer(tokenizer, [(CALL, "completed"), (ANSWER, "completed")])
    out = await make_loop(cfg, tokenizer, server, load_tools(CALC_CONFIG)).run({"temperature": 1.0}, **row(**fields))
    return server, out


def assert_ran_whole(server, out, tokenizer):
    assert len(server.calls) == 2 and out.extra_fields[TOOL_CALLS] == 1 and RESUME_AT not in out.extra_fields
    assert tokenizer.decode(out.response_ids).rstrip().endswith(f"{ANSWER}{tasks.IM_END}")


def test_a_trajectory_starting_between_open_and_its_workers_poll_runs_whole(tokenizer_dir, tokenizer, tmp_path,
                                                                            monkeypatch):
    """The driver's ``open()`` has returned (the actor is open) but the reply to this worker's poll is still in
    flight: its view is closed for STEP. The next step's trajectory and validation's start now and run whole (on the
    gate without step identity both ended with zero tokens)."""
    cfg = compose(tokenizer_dir, tmp_path)

    async def scenario():
        state = GateState()
        state.close(STEP)
        source, watch = held_gate(monkeypatch, state)
        source.release()
        await source.polled(2)
        assert watch.cuts(STEP)
        state.open()  # DriverGate.open() returned; the reply telling the worker is held
        await source.answered(2)
        runs = [await run_one(cfg, tokenizer, step=STEP + 1), await run_one(cfg, tokenizer, step=None)]
        assert watch.cuts(STEP)  # the view was stale all along
        source.release()
        await source.polled(3)
        assert watch.step is None
        watch.stop()
        return runs

    for server, out in asyncio.run(asyncio.wait_for(scenario(), 120)):
        assert_ran_whole(server, out, tokenizer)


def test_a_close_heard_after_the_open_cuts_nothing_of_the_next_step(tokenizer_dir, tokenizer, tmp_path, monkeypatch):
    """Close-then-open before the worker's poll returns: the actor answered the pending poll with "closed for STEP",
    the driver opened, and only then does the reply reach the worker. The next step's trajectory starting now runs
    whole, and the watch's next poll shows the gate open (on the gate without step identity it ended empty)."""
    cfg = compose(tokenizer_dir, tmp_path)

    async def scenario():
        state = GateState()
        source, watch = held_gate(monkeypatch, state)
        source.release()
        await source.polled(2)
        assert watch.step is None
        state.close(STEP)
        await source.answered(2)  # the reply "closed for STEP" is in flight
        state.open()
        source.release()
        await source.polled(3)  # the worker hears the close now, after the open
        assert watch.cuts(STEP)
        server, out = await run_one(cfg, tokenizer, step=STEP + 1)
        source.release()
        await source.polled(4)
        reopened = watch.step is None
        watch.stop()
        return server, out, reopened

    server, out, reopened = asyncio.run(asyncio.wait_for(scenario(), 120))
    assert_ran_whole(server, out, tokenizer)
    assert reopened


def test_two_successive_tool_turns_each_get_their_own_reply(tokenizer_dir, tokenizer, tmp_path):
    """Replies are remembered by the call's index within its turn (for a cut parallel stage): the second turn's call
    has index 0 too and must run, not get the first turn's reply."""
    cfg = compose(tokenizer_dir, tmp_path, response_length=128)
    second = tasks.tool_call_text("2+2")
    server = ScriptedServer(tokenizer, [(CALL, "completed"), (second, "completed"), (ANSWER, "completed")])
    runs = []
    out = run_loop(cfg, tokenizer, server, counted(load_tools(CALC_CONFIG), runs), {"temperature": 1.0}, **row())
    text = tokenizer.decode(out.response_ids)
    assert [parameters["expression"] for parameters, _ in runs] == ["12*7+3", "2+2"]
    first_reply, second_reply = text.find("<tool_response>\n87\n</tool_response>"), text.find(
        "<tool_response>\n4\n</tool_response>")
    assert 0 <= first_reply < second_reply
    assert len(server.calls) == 3 and out.extra_fields[TOOL_CALLS] == 2


# ---------------------------------------------------------------- resuming a cut trajectory (over-sample continue)

CONTINUE = ["recipe.over_sample.enable=1", "recipe.over_sample.requeue=continue"]
BUDGET, ROW_SEED, SESSION = 48, 11, 1


@pytest.fixture()
def turn_ids(tokenizer):
    """Token ids of the two turns as Qwen3 ends them (EOS after the tool call too): (call turn, answer turn)."""
    end = tokenizer.convert_tokens_to_ids(tasks.IM_END)
    return (tokenizer.encode(CALL, add_special_tokens=False) + [end],
            tokenizer.encode(ANSWER, add_special_tokens=False) + [end])


def counted(tools, runs):
    """verl's loaded tools, each execution appended to ``runs`` as it starts: its arguments and the chat it sees."""
    for tool in tools:
        async def execute(instance_id, parameters, _execute=tool.execute, **kwargs):
            runs.append((parameters, list(kwargs["agent_data"].messages)))
            return await _execute(instance_id, parameters, **kwargs)

        tool.execute = execute
    return tools


def stored(monkeypatch, out):
    """Serve ``out`` as verl's worker stores it in TransferQueue (``AgentLoopWorkerTQ._agent_loop_postprocess``) to
    ``fetch_partial``; returns the keys it is asked for."""
    import transfer_queue
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    record = list_of_dict_to_tensordict([{**out.as_dict(), "session_id": SESSION}])
    asked = []

    async def get(keys, partition_id, select_fields):  # like TransferQueue, fields the record lacks are left out
        asked.append((keys, partition_id))
        return record.select(*[f for f in select_fields if f in record.keys()])

    monkeypatch.setattr(transfer_queue, "async_kv_batch_get", get)
    return asked


def resume_row(complete=False, cap=BUDGET, resumes=1, **fields):
    """The re-queued row (session 1 of group ``u``), as the driver launches it in a run that computes log-probs."""
    ref = PartialRef(key_prefix="u", partition_id="train", complete=[False, complete], min_version=3,
                     resumes=resumes, has_logprobs=True)
    return row(**{CAP: cap, SEED: ROW_SEED, PARTIAL: ref.to_json()}, **fields)


def run_script(cfg, tokenizer, script, runs, version=4, logprob=-0.5, routes=False, **fields):
    """One trajectory on a fresh scripted server (``routes``: it returns routes); returns (output, server)."""
    server = ScriptedServer(tokenizer, script, logprob=logprob, version=version, routes=routes)
    out = run_loop(cfg, tokenizer, server, counted(load_tools(CALC_CONFIG), runs), {"temperature": 1.0,
                                                                                    "logprobs": True}, **fields)
    return out, server


def cut_run(cfg, tokenizer, script, routes=False):
    """The aborted first attempt (policy version 3, log-probs -0.25): (output, tool executions)."""
    runs = []
    out, _ = run_script(cfg, tokenizer, script, runs, version=3, logprob=-0.25, routes=routes,
                        **row(**{CAP: BUDGET, SEED: ROW_SEED}))
    return out, runs


def uncut(cfg, tokenizer, turn_ids):
    """The trajectory an uninterrupted run with the same tokens produces."""
    out, _ = run_script(cfg, tokenizer, [(turn_ids[0], "completed"), (turn_ids[1], "completed")], [],
                        **row(**{CAP: BUDGET, SEED: ROW_SEED}))
    return out


def cut_in_tool_stage(monkeypatch, cfg, tokenizer, turn, execute, cap=BUDGET):
    """The aborted first attempt (policy version 3, log-probs -0.25) of a trajectory whose one turn ``turn`` calls the
    calculator, cut in its tool stage: ``execute(close_gate, calculate, instance_id, parameters, **kwargs)`` stands in
    for the calculator's ``execute`` (``close_gate()`` closes the rollout gate as the driver's abort does;
    ``calculate`` is the real one). Returns the output."""
    async def scenario():
        state, watch = await local_gate_watch(monkeypatch)
        tools = load_tools(CALC_CONFIG)

        async def stand_in(instance_id, parameters, _calculate=tools[0].execute, **kwargs):
            return await execute(lambda: state.close(STEP), _calculate, instance_id, parameters, **kwargs)

        tools[0].execute = stand_in
        server = ScriptedServer(tokenizer, [(turn, "completed")], logprob=-0.25, version=3)
        out = await make_loop(cfg, tokenizer, server, tools).run({"temperature": 1.0, "logprobs": True},
                                                                 **row(**{CAP: cap, SEED: ROW_SEED}))
        watch.stop()
        return out

    first = asyncio.run(scenario())
    monkeypatch.undo()
    return first


def assert_is_stored_plus_continuation(resumed, first, reference):
    """The trained trajectory is the cut one (tokens, mask, log-probs) followed by its continuation; with the same
    tokens it is what the uninterrupted run produced, tool replies at mask 0."""
    n = len(first.response_ids)
    assert resumed.prompt_ids == first.prompt_ids == reference.prompt_ids
    assert resumed.response_ids == reference.response_ids and resumed.response_ids[:n] == first.response_ids
    assert resumed.response_mask == reference.response_mask and 0 in resumed.response_mask
    assert resumed.response_logprobs[:n] == first.response_logprobs
    assert resumed.response_logprobs[n:] == reference.response_logprobs[n:]
    assert resumed.num_turns == reference.num_turns == 4 and resumed.extra_fields[TOOL_CALLS] == 1
    assert RESUME_AT not in resumed.extra_fields
    # verl's timings add up over both attempts (tool seconds feed the sampler's time key)
    assert resumed.metrics.tool_calls >= first.metrics.tool_calls
    assert resumed.metrics.generate_sequences >= first.metrics.generate_sequences > 0
    # versions: the oldest is the cut attempt's (3), the newest the resume's (4)
    assert (resumed.extra_fields["min_global_steps"], resumed.extra_fields["max_global_steps"]) == (3, 4)


@pytest.mark.parametrize("turn", [0, 1])
def test_a_turn_cut_mid_way_continues_after_its_stored_tokens(tokenizer_dir, tokenizer, tmp_path, monkeypatch,
                                                               turn_ids, turn):
    """Turn 0 cut: its continuation completes the tool call, which runs once. Turn 1 cut (after a completed tool
    call): only the answer continues; the completed call is not run again."""
    cfg = compose(tokenizer_dir, tmp_path, extra=CONTINUE)
    call, answer = turn_ids
    if turn == 0:
        k = len(call) // 2
        first, first_runs = cut_run(cfg, tokenizer, [(call[:k], "aborted")])
        rest = [(call[k:], "completed"), (answer, "completed")]
    else:
        k = len(answer) // 2
        first, first_runs = cut_run(cfg, tokenizer, [(call, "completed"), (answer[:k], "aborted")])
        rest = [(answer[k:], "completed")]
    at = first.extra_fields[RESUME_AT]
    assert (at["stage"], at["assistant_turns"], at["user_turns"], len(first_runs)) == (GENERATE, turn, turn, turn)
    asked = stored(monkeypatch, first)

    runs = []
    resumed, server = run_script(cfg, tokenizer, rest, runs, **resume_row())

    assert asked == [(["u_1_0"], "train")]
    assert len(runs) == 1 - turn  # the call completed before the cut is never re-run
    n = len(first.response_ids)
    continuation = server.calls[0]
    assert continuation["prompt_ids"] == first.prompt_ids + first.response_ids
    assert continuation["sampling_params"]["max_tokens"] == BUDGET - n
    assert [c["sampling_params"]["seed"] for c in server.calls] == [turn_seed(ROW_SEED, SESSION, t)
                                                                     for t in range(turn, 2)]
    assert_is_stored_plus_continuation(resumed, first, uncut(cfg, tokenizer, turn_ids))


def test_a_cancelled_tool_call_is_issued_again_once_on_resume(tokenizer_dir, tokenizer, tmp_path, monkeypatch,
                                                              turn_ids):
    """The gate closes while the calculator runs: the call is cancelled (it never replied), the trajectory ends on
    its tool-call turn (EOS last). The resume issues that call once and goes on to the next turn."""
    cfg = compose(tokenizer_dir, tmp_path, extra=CONTINUE)
    call, answer = turn_ids
    started = []

    async def hangs(close_gate, calculate, instance_id, parameters, **kwargs):  # aborted while the tool runs
        started.append((parameters, list(kwargs["agent_data"].messages)))
        close_gate()
        await asyncio.sleep(30)

    first = cut_in_tool_stage(monkeypatch, cfg, tokenizer, call, hangs)
    assert len(started) == 1 and first.response_ids == call and first.response_mask == [1] * len(call)
    assert first.extra_fields[TOOL_CALLS] == 0  # cancelled: no reply joined
    at = first.extra_fields[RESUME_AT]
    assert (at["stage"], at["tokens"], at["assistant_turns"]) == (TOOLS, len(call), 1)
    stored(monkeypatch, first)

    runs = []
    resumed, server = run_script(cfg, tokenizer, [(answer, "completed")], runs, **resume_row())
    reference = uncut(cfg, tokenizer, turn_ids)

    assert runs == started  # issued again, once, on the same chat (the assistant message holds the call)
    assert [m["role"] for m in started[0][1]] == ["user", "assistant"] and started[0][1][1]["tool_calls"]
    assert [c["sampling_params"]["seed"] for c in server.calls] == [turn_seed(ROW_SEED, SESSION, 1)]
    n_reply = len(reference.response_ids) - len(call) - len(answer)
    assert server.calls[0]["sampling_params"]["max_tokens"] == BUDGET - len(call) - n_reply
    assert_is_stored_plus_continuation(resumed, first, reference)


def test_parallel_calls_answered_before_the_cut_are_not_run_again(tokenizer_dir, tokenizer, tmp_path, monkeypatch,
                                                                  turn_ids):
    """Two calls in one turn (``max_parallel_calls=2``): the first answers, the gate closes while the second runs and
    cancels it. The resume issues only the second; the first's stored reply joins the context, and the trained
    trajectory is what an uncut run produces."""
    cfg = compose(tokenizer_dir, tmp_path, response_length=128,
                  extra=[*CONTINUE, "actor_rollout_ref.rollout.multi_turn.max_parallel_calls=2"])
    budget = 120  # two calls, two replies and the answer
    end = tokenizer.convert_tokens_to_ids(tasks.IM_END)
    calls = tokenizer.encode(CALL + "\n" + tasks.tool_call_text("2+2"), add_special_tokens=False) + [end]
    answer = turn_ids[1]
    started = []

    async def second_hangs(close_gate, calculate, instance_id, parameters, **kwargs):
        started.append(parameters["expression"])
        if parameters["expression"] == "2+2":  # aborted while it runs (the first call has answered)
            await asyncio.sleep(0.2)
            close_gate()
            await asyncio.sleep(30)
        return await calculate(instance_id, parameters, **kwargs)

    first = cut_in_tool_stage(monkeypatch, cfg, tokenizer, calls, second_hangs, cap=budget)
    assert sorted(started) == ["12*7+3", "2+2"] and first.response_ids == calls
    at = first.extra_fields[RESUME_AT]
    assert (at["stage"], len(at["pending_calls"])) == (TOOLS, 2)
    assert at["answered_calls"] == [{"index": 0, "text": "87", "reward": 0.0}]
    assert first.extra_fields[TOOL_CALLS] == 0  # one call answered, but the stage's replies never joined
    stored(monkeypatch, first)

    runs = []
    resumed, _ = run_script(cfg, tokenizer, [(answer, "completed")], runs, **resume_row(cap=budget))
    reference, _ = run_script(cfg, tokenizer, [(calls, "completed"), (answer, "completed")], [],
                              **row(**{CAP: budget, SEED: ROW_SEED}))

    assert [parameters["expression"] for parameters, _ in runs] == ["2+2"]  # the answered call is not run again
    assert (resumed.response_ids, resumed.response_mask) == (reference.response_ids, reference.response_mask)
    assert resumed.extra_fields[TOOL_CALLS] == reference.extra_fields[TOOL_CALLS] == 2
    assert "87" in tokenizer.decode(resumed.response_ids) and "\n4\n" in tokenizer.decode(resumed.response_ids)


def test_a_trajectory_cut_after_a_tool_reply_starts_its_next_turn(tokenizer_dir, tokenizer, tmp_path, monkeypatch,
                                                                  turn_ids):
    """The turn after the tool reply was refused at once (an empty aborted reply: the server was already aborting):
    the resume starts that turn from the stored context, with no tool run."""
    cfg = compose(tokenizer_dir, tmp_path, extra=CONTINUE)
    call, answer = turn_ids
    first, first_runs = cut_run(cfg, tokenizer, [(call, "completed"), ([], "aborted")])
    assert len(first_runs) == 1 and first.extra_fields[RESUME_AT]["tokens"] == len(first.response_ids)
    stored(monkeypatch, first)

    runs = []
    resumed, server = run_script(cfg, tokenizer, [(answer, "completed")], runs, **resume_row())

    assert runs == []
    assert server.calls[0]["prompt_ids"] == first.prompt_ids + first.response_ids
    assert server.calls[0]["sampling_params"]["max_tokens"] == BUDGET - len(first.response_ids)
    assert [c["sampling_params"]["seed"] for c in server.calls] == [turn_seed(ROW_SEED, SESSION, 1)]
    assert_is_stored_plus_continuation(resumed, first, uncut(cfg, tokenizer, turn_ids))


def test_a_trajectory_cut_before_its_first_turn_starts_afresh(tokenizer_dir, tokenizer, tmp_path, monkeypatch,
                                                             turn_ids):
    """The gate was closed before the first turn: nothing is stored but the chat; the resume is a whole run, whose
    oldest policy version is still the cut attempt's."""
    cfg = compose(tokenizer_dir, tmp_path, extra=CONTINUE)

    async def closed_gate():
        _, watch = await local_gate_watch(monkeypatch, closed_for=STEP)
        server = ScriptedServer(tokenizer, [])
        out = await make_loop(cfg, tokenizer, server, load_tools(CALC_CONFIG)).run(
            {"temperature": 1.0, "logprobs": True}, **row(**{CAP: BUDGET, SEED: ROW_SEED}))
        watch.stop()
        return out

    first = asyncio.run(closed_gate())
    monkeypatch.undo()
    assert first.response_ids == [] and first.extra_fields[RESUME_AT]["tokens"] == 0
    stored(monkeypatch, first)

    runs = []
    resumed, server = run_script(cfg, tokenizer, [(turn_ids[0], "completed"), (turn_ids[1], "completed")], runs,
                                 **resume_row())
    reference = uncut(cfg, tokenizer, turn_ids)

    assert len(runs) == 1 and server.calls[0]["sampling_params"]["max_tokens"] == BUDGET
    assert (resumed.response_ids, resumed.response_mask, resumed.response_logprobs) == (
        reference.response_ids, reference.response_mask, reference.response_logprobs)
    assert (resumed.extra_fields["min_global_steps"], resumed.extra_fields["max_global_steps"]) == (3, 4)


@pytest.mark.parametrize("how", ["complete", "never cut"])
def test_a_finished_session_is_returned_as_it_was(tokenizer_dir, tokenizer, tmp_path, monkeypatch, turn_ids, how):
    """``complete`` in the reference (the driver saw it finished), or a record the abort never cut: nothing runs."""
    cfg = compose(tokenizer_dir, tmp_path, extra=CONTINUE)
    call, answer = turn_ids
    if how == "complete":
        first, _ = cut_run(cfg, tokenizer, [(call, "completed"), (answer[:3], "aborted")])
    else:
        first = uncut(cfg, tokenizer, turn_ids)
    stored(monkeypatch, first)

    runs = []
    out, server = run_script(cfg, tokenizer, [], runs, **resume_row(complete=how == "complete"))

    assert server.calls == [] and runs == []
    assert (out.prompt_ids, out.response_ids, out.response_mask, out.response_logprobs, out.num_turns) == (
        first.prompt_ids, first.response_ids, first.response_mask, first.response_logprobs, first.num_turns)
    # every token is the stored attempt's: left out of rollout/mismatch/* (an older policy's log-probs)
    assert out.extra_fields == {**{k: v for k, v in first.extra_fields.items() if k != RESUME_AT},
                                STALE: len(first.response_ids)}
    assert out.metrics == first.metrics


@pytest.mark.parametrize("past_cap", [0, 5], ids=["fill", "past"])
@pytest.mark.parametrize("stage", [GENERATE, TOOLS])
def test_stored_tokens_that_fill_the_budget_end_the_trajectory(tokenizer_dir, tokenizer, tmp_path, monkeypatch,
                                                               turn_ids, stage, past_cap):
    """The budget counts the stored tokens: a resumed launch whose cap they already fill generates nothing and runs
    no tool (a cut turn is not parsed; a pending tool call's reply could not join). Stored tokens past this step's
    cap (a smaller cap than the step that cut them) are trained as they are, not cut back to the cap."""
    cfg = compose(tokenizer_dir, tmp_path, extra=CONTINUE)
    call, _ = turn_ids
    script = [(call[:-4], "aborted")] if stage == GENERATE else [(call, "completed"), ([], "aborted")]
    first, _ = cut_run(cfg, tokenizer, script)
    if stage == TOOLS:  # cut as if the tool stage had been cancelled: the tool reply was never appended
        first = first.model_copy(update={"response_ids": call, "response_mask": [1] * len(call),
                                         "response_logprobs": [-0.25] * len(call)})
        first.extra_fields[RESUME_AT].update(stage=TOOLS, tokens=len(call), pending_calls=[
            {"name": "calculator", "arguments": '{"expression": "12*7+3"}', "tool_call_id": None}])
    stored(monkeypatch, first)

    runs = []
    out, server = run_script(cfg, tokenizer, [], runs, **resume_row(cap=len(first.response_ids) - past_cap))

    assert server.calls == [] and runs == []
    assert out.response_ids == first.response_ids and out.response_mask == first.response_mask


def test_mask_stale_tokens_leaves_only_the_continuation_in_the_loss(tokenizer_dir, tokenizer, tmp_path, monkeypatch,
                                                                    turn_ids):
    cfg = compose(tokenizer_dir, tmp_path, extra=[*CONTINUE, "recipe.over_sample.mask_stale_tokens=true"])
    call, answer = turn_ids
    first, _ = cut_run(cfg, tokenizer, [(call, "completed"), (answer[:4], "aborted")])
    stored(monkeypatch, first)

    resumed, _ = run_script(cfg, tokenizer, [(answer[4:], "completed")], [], **resume_row())

    n = len(first.response_ids)
    assert resumed.response_mask == [0] * n + [1] * (len(answer) - 4)
    assert resumed.response_ids == uncut(cfg, tokenizer, turn_ids).response_ids


def test_a_cut_run_records_where_to_resume_only_in_continue_mode(tokenizer_dir, tokenizer, tmp_path, turn_ids):
    cfg = compose(tokenizer_dir, tmp_path)  # over-sample restart (the default)
    first, _ = cut_run(cfg, tokenizer, [(turn_ids[0][:5], "aborted")])
    assert RESUME_AT not in first.extra_fields


def test_a_multimodal_model_is_refused_by_name(tokenizer_dir, tokenizer, tmp_path, monkeypatch, turn_ids):
    cfg = compose(tokenizer_dir, tmp_path, extra=CONTINUE)
    first, _ = cut_run(cfg, tokenizer, [(turn_ids[0][:5], "aborted")])
    stored(monkeypatch, first)

    async def go():
        loop = make_loop(cfg, tokenizer, ScriptedServer(tokenizer, []), load_tools(CALC_CONFIG))
        loop.processor = object()  # what verl sets for a vision-language model
        return await loop.run({"temperature": 1.0}, **resume_row())

    with pytest.raises(ValueError, match="text-only.*OVER_SAMPLE_REQUEUE=restart"):
        asyncio.run(go())


# ---------------------------------------------------------------- routing replay (R3) on the resume paths

R3 = "actor_rollout_ref.rollout.enable_rollout_routing_replay=True"


@pytest.fixture()
def r3_model_dir(tokenizer_dir, tmp_path):
    """The tokenizer beside a config.json that sizes route rows (``R3_SHAPE``), as the model dir R3 reads."""
    import shutil

    out = tmp_path / "r3-model"
    shutil.copytree(tokenizer_dir, out)
    (out / "config.json").write_text(json.dumps({"num_hidden_layers": R3_SHAPE[0],
                                                 "num_experts_per_tok": R3_SHAPE[1]}))
    return out


def assert_routes_every_row(out):
    """What verl's worker puts into TransferQueue carries routes, one row per token (prompt + response)."""
    assert out.routed_experts is not None
    assert out.as_dict()["routed_experts"].shape == (len(out.prompt_ids) + len(out.response_ids), *R3_SHAPE)


@pytest.mark.parametrize("how", ["finished", "budget spent"])
def test_r3_a_resumed_trajectory_whose_stale_tokens_are_masked_still_carries_routes(
        tokenizer_dir, tokenizer, tmp_path, monkeypatch, turn_ids, r3_model_dir, how):
    """``mask_stale_tokens``: a session handed back as it finished, or one whose stored tokens fill this launch's
    budget, trains nothing. No prefill is spent on it, and it still carries the routes field: a batch mixing rows
    with and without it is refused (TransferQueue) or fails the update (Megatron: "micro_batch has no
    routed_experts")."""
    cfg = compose(tokenizer_dir, tmp_path, extra=[*CONTINUE, "recipe.over_sample.mask_stale_tokens=true", R3],
                  model=r3_model_dir)
    call, answer = turn_ids
    first, _ = cut_run(cfg, tokenizer, [(call, "completed"), (answer[:4], "aborted")], routes=True)
    stored(monkeypatch, first)

    n = len(first.response_ids)
    fields = resume_row(complete=True) if how == "finished" else resume_row(cap=n)
    out, server = run_script(cfg, tokenizer, [], [], routes=True, **fields)

    assert server.calls == [] and out.response_ids == first.response_ids and out.response_mask == [0] * n
    assert_routes_every_row(out)


def test_r3_a_resumed_trajectory_cut_again_before_its_first_request_keeps_its_earlier_turns(
        tokenizer_dir, tokenizer, tmp_path, monkeypatch, turn_ids, r3_model_dir):
    """``max_resumes`` 2: resumed once, the trajectory is cut again before it sends a request (the gate was closed),
    so this launch has no routes for it. Its group lost the race: it is not trained now, and the mask stored for the
    next resume is the one it had, so its earlier turns are trained when it finishes (not left at 0 for good)."""
    cfg = compose(tokenizer_dir, tmp_path, extra=[*CONTINUE, "recipe.over_sample.max_resumes=2", R3],
                  model=r3_model_dir)
    call, answer = turn_ids
    first, _ = cut_run(cfg, tokenizer, [(call, "completed"), (answer[:4], "aborted")], routes=True)
    assert first.routed_experts is None  # cut by over-sampling: no routes held while it waits
    stored(monkeypatch, first)

    async def cut_at_once():
        _, watch = await local_gate_watch(monkeypatch, closed_for=STEP)
        server = ScriptedServer(tokenizer, [], routes=True)
        out = await make_loop(cfg, tokenizer, server, load_tools(CALC_CONFIG)).run(
            {"temperature": 1.0, "logprobs": True}, **resume_row())
        watch.stop()
        return out, server

    again, server = asyncio.run(cut_at_once())
    monkeypatch.undo()
    # cut at the boundary it resumed from (the cut turn's stored part is regenerated next time)
    n = again.extra_fields[RESUME_AT]["tokens"]
    assert server.calls == [] and again.response_ids == first.response_ids[:n]
    assert again.response_mask == first.response_mask[:n] and again.response_mask[:len(call)] == [1] * len(call)
    assert again.routed_experts is None and "unrouted_masked_tokens" not in again.extra_fields
    stored(monkeypatch, again)

    done, _ = run_script(cfg, tokenizer, [(answer, "completed")], [], routes=True, **resume_row(resumes=2))

    reference = uncut(compose(tokenizer_dir, tmp_path, extra=CONTINUE), tokenizer, turn_ids)
    assert done.response_ids == reference.response_ids and done.response_mask == reference.response_mask
    assert "unrouted_masked_tokens" not in done.extra_fields
    assert_routes_every_row(done)


def test_r3_a_handed_back_session_whose_prefill_is_aborted_keeps_its_turns(
        tokenizer_dir, tokenizer, tmp_path, monkeypatch, turn_ids, r3_model_dir):
    """A finished session of a resumed group is handed back; over-sampling's abort lands on its routes prefill. Its
    group is not trained this step: the stored mask stays (with ``max_resumes`` 2 it is handed back again, turns
    and all) and no routes are held."""
    cfg = compose(tokenizer_dir, tmp_path, extra=[*CONTINUE, "recipe.over_sample.max_resumes=2", R3],
                  model=r3_model_dir)
    first = uncut(compose(tokenizer_dir, tmp_path, extra=CONTINUE), tokenizer, turn_ids)
    stored(monkeypatch, first)

    out, server = run_script(cfg, tokenizer, [([], "aborted")], [], **resume_row(complete=True))

    assert len(server.calls) == 1 and server.calls[0]["sampling_params"]["max_tokens"] == 1
    assert out.response_mask == first.response_mask and 1 in out.response_mask
    assert out.routed_experts is None and "unrouted_masked_tokens" not in out.extra_fields


def test_r3_a_re_prefill_queues_at_the_rows_priority_under_the_trajectorys_request_id(
        tokenizer_dir, tokenizer, tmp_path, monkeypatch, turn_ids, r3_model_dir):
    """A trajectory resumed with its budget spent makes no request of its own: its routes are re-prefilled at the
    row's priority (a resumed group's) under the trajectory's request id (verl's ``det-<priority>`` under
    ``full_determinism``), marked with its group's prompt for the group-affinity router."""
    from recipe.adapter.router import group_prompt, group_request_id

    cfg = compose(tokenizer_dir, tmp_path, extra=[*CONTINUE, R3, "actor_rollout_ref.rollout.full_determinism=True"],
                  model=r3_model_dir)
    call, answer = turn_ids
    first, _ = cut_run(cfg, tokenizer, [(call, "completed"), (answer[:4], "aborted")], routes=True)
    stored(monkeypatch, first)
    priority = -(2**30)

    out, server = run_script(cfg, tokenizer, [], [], routes=True,
                             **resume_row(cap=len(first.response_ids), priority=priority))

    (prefill,) = server.calls
    assert prefill["priority"] == priority and prefill["sampling_params"]["max_tokens"] == 1
    assert prefill["request_id"] == group_request_id(f"det-{priority}", len(out.prompt_ids))
    assert group_prompt(prefill["request_id"], prefill["prompt_ids"]) == out.prompt_ids
    assert out.response_mask == first.response_mask
    assert_routes_every_row(out)


def test_r3_each_turn_asks_only_for_its_new_tokens_routes(tokenizer_dir, tokenizer, tmp_path, r3_model_dir):
    """Every turn's prompt is the conversation so far: vLLM's ``routed_experts_prompt_start`` skips the rows the
    earlier turns returned (the routes traffic of a trajectory is its final routes once, not once per turn), and verl,
    which keeps the last turn's routes, still gets every row of the trajectory in place."""
    from recipe.adapter.routes import PROMPT_START

    class SkippingServer(ScriptedServer):
        """Routes as vLLM returns them with ``routed_experts_prompt_start``: row ``i`` names position ``i``."""

        async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
            out = await super().generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params, **kwargs)
            start = sampling_params.get(PROMPT_START, 0)
            assert 0 <= start < len(prompt_ids)  # vLLM's scheduler asserts it
            rows = np.arange(start, len(prompt_ids) + len(out.token_ids) - 1) % 200
            return out.model_copy(update={"routed_experts": np.broadcast_to(
                rows[:, None, None], (len(rows), *R3_SHAPE)).astype(np.uint8)})

    cfg = compose(tokenizer_dir, tmp_path, response_length=128, extra=[R3], model=r3_model_dir)
    server = SkippingServer(tokenizer, [(CALL, "completed"), (ANSWER, "completed")], routes=True)
    out = run_loop(cfg, tokenizer, server, load_tools(CALC_CONFIG), {"temperature": 1.0}, **row())
    first, second = server.calls
    call_turn = tokenizer.encode(CALL, add_special_tokens=False)
    assert PROMPT_START not in first["sampling_params"]
    # the rows the first turn returned: its prompt and reply but the reply's last token (never forwarded)
    assert second["sampling_params"][PROMPT_START] == len(first["prompt_ids"]) + len(call_turn) - 1
    assert second["prompt_ids"][:len(first["prompt_ids"]) + len(call_turn)] == first["prompt_ids"] + call_turn
    rows = len(out.prompt_ids) + len(out.response_ids) - 1
    np.testing.assert_array_equal(out.routed_experts[:, 0, 0], np.arange(rows) % 200)
