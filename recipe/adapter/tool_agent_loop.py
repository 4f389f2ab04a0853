"""verl's ``ToolAgentLoop`` with the recipe's per-row budget, per-turn seeds, priorities and abort handling.

Registered through ``configs/agent_loops.yaml`` as ``length_capped_tool_agent`` and also under verl's own name
``tool_agent``, so rows written for verl's tool agent (``agent_name: tool_agent``) get the cap too; ``MULTI_TURN=1``
makes it the default agent loop. What it changes, and why:

* **Budget.** The row's cap (``response_max_tokens_cap``) is the trajectory's token budget, counted as verl counts
  ``response_length``: assistant and tool tokens together. verl builds one loop per trajectory
  (``AgentLoopWorker._run_agent_loop``), so the instance's ``response_length`` is the row's budget and all of
  verl's checks (after each turn, after each tool reply, the final cut) apply it. verl never sets ``max_tokens``, so
  a turn may run to the server's default and be cut afterwards; here each turn asks for what is left of the budget.
* **Seeds.** With ``recipe.sampling_seed`` each turn gets its own vLLM seed (``recipe.core.seeds.turn_seed``).
* **Priority.** verl's loop accepts the row's ``priority`` but does not pass it on; here every turn carries it.
* **Aborts.** A turn vLLM returns as ``aborted`` (over-sample settle, the tail cut) ends the trajectory: its tokens
  are kept (they are the policy's), it is not parsed for tool calls and no tool runs. No new turn starts while the
  rollout gate is closed (``recipe.adapter.rollout_gate``), and a tool stage running when the gate closes is
  cancelled: the sandbox's whole process group is killed. So a step's abort never waits on a tool and never leaves
  one running, and a trajectory cut by the tail cut between turns ends as truncated instead of waiting for a resume
  that comes only after the step.

Over-sample ``continue`` (partial rollout) is not supported on multi-turn rows: the preflight refuses it and a row
that carries a partial-rollout reference fails by name.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from verl.experimental.agent_loop.tool_agent_loop import AgentData, AgentState, ToolAgentLoop

from ..core.seeds import turn_seed
from .agent_loop import row_int
from .fields import CAP, PARTIAL, SEED
from .partial import PartialRef
from .rollout_gate import GateWatch, gate_watch
from .turns import TOOL_CALLS

logger = logging.getLogger(__name__)

TOOL_AGENT_LOOP_NAME = "length_capped_tool_agent"
ABORTED = "aborted"


class _TurnClient:
    """verl's server client for one trajectory: adds the row's priority and remembers how the last turn ended."""

    def __init__(self, inner, priority: int):
        self.inner, self.priority = inner, priority
        self.last_stop_reason: str | None = None

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def generate(self, request_id, **kwargs):
        if self.priority:
            kwargs["priority"] = self.priority
        out = await self.inner.generate(request_id, **kwargs)
        self.last_stop_reason = out.stop_reason
        return out


class _SkipAbortedParser:
    """verl's tool parser, not consulted for a turn that was aborted (its text is not a finished turn)."""

    def __init__(self, inner, client: _TurnClient):
        self.inner, self.client = inner, client

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def extract_tool_calls(self, response_ids, tools):
        if self.client.last_stop_reason == ABORTED:
            return "", []
        return await self.inner.extract_tool_calls(response_ids, tools)


class CappedToolAgentLoop(ToolAgentLoop):
    gate: GateWatch | None = None

    async def run(self, sampling_params: dict[str, Any], priority: int = 0, **kwargs) -> Any:
        if getattr(self, "_ran", False):
            raise RuntimeError("CappedToolAgentLoop holds one trajectory's budget: build one loop per trajectory "
                               "(as verl's AgentLoopWorker does)")
        self._ran = True
        if PartialRef.from_field(kwargs.get(PARTIAL)) is not None:
            raise ValueError(f"row field {PARTIAL!r} is set on a multi-turn row: over-sample requeue 'continue' is "
                             "not supported with MULTI_TURN=1; use OVER_SAMPLE_REQUEUE=restart")
        cap = row_int(kwargs.get(CAP))
        if 0 < cap < self.response_length:
            self.response_length = cap
        seed = row_int(kwargs.get(SEED), absent=-1)
        self._seed = (seed, int(kwargs["session_id"])) if seed >= 0 else None
        self._client = _TurnClient(self.server_manager, row_int(priority))
        self.server_manager = self._client
        self.tool_parser = _SkipAbortedParser(self.tool_parser, self._client)
        self.gate = await gate_watch()
        self._tool_calls = 0
        output = await super().run(sampling_params, priority=priority, **kwargs)
        output.extra_fields[TOOL_CALLS] = self._tool_calls  # calls whose replies joined the trajectory (the traces)
        if not output.response_mask:
            # ended before its first token (aborted, or the gate was closed): verl slices the response as
            # ``ids[-len(mask):]``, which is the whole prompt for an empty mask
            output.response_ids, output.response_logprobs = [], None
        return output

    def _gate_closed(self) -> bool:
        return self.gate is not None and self.gate.closed

    async def _handle_generating_state(self, agent_data: AgentData, sampling_params: dict[str, Any],
                                       ignore_termination: bool = False) -> AgentState:
        remaining = self.response_length - len(agent_data.response_mask)
        if remaining <= 0:
            return AgentState.TERMINATED
        if self._gate_closed():  # the step is being aborted: a new turn would wait for (or be refused) a resume
            return AgentState.TERMINATED
        params = {**sampling_params, "max_tokens": remaining}
        if self._seed is not None:
            params["seed"] = turn_seed(*self._seed, agent_data.assistant_turns)
        state = await super()._handle_generating_state(agent_data, params, ignore_termination)
        if self._client.last_stop_reason == ABORTED:
            return AgentState.TERMINATED
        return state

    async def _handle_processing_tools_state(self, agent_data: AgentData) -> AgentState:
        calls = len(agent_data.tool_calls[: self.max_parallel_calls])
        state = await self._run_tools(agent_data)
        if state == AgentState.GENERATING:  # the replies joined the context (verl ends it when they do not fit)
            self._tool_calls += calls
        return state

    async def _run_tools(self, agent_data: AgentData) -> AgentState:
        if self.gate is None:
            return await super()._handle_processing_tools_state(agent_data)
        if self.gate.closed:
            return AgentState.TERMINATED
        tools = asyncio.ensure_future(super()._handle_processing_tools_state(agent_data))
        closed = asyncio.ensure_future(self.gate.wait_closed())
        try:
            await asyncio.wait({tools, closed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            closed.cancel()
            if not tools.done():  # the gate closed first (or this task was cancelled): stop the tools
                tools.cancel()
                await asyncio.gather(tools, return_exceptions=True)
        if tools.cancelled():
            # a warning, so the run's log shows each cancellation (the e2e test counts them)
            logger.warning("%s: rollout aborted during a tool call: %d call(s) cancelled, the trajectory ends",
                           agent_data.request_id, len(agent_data.tool_calls[: self.max_parallel_calls]))
            return AgentState.TERMINATED
        return tools.result()

