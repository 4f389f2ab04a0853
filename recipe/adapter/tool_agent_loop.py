"""verl's ``ToolAgentLoop`` with the recipe's per-row budget, per-turn seeds, priorities, abort handling and resumption.

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
  rollout gate (``recipe.adapter.rollout_gate``) is closed for the trajectory's step (the row's ``rollout_step``),
  and a tool stage running when it closes for that step is cancelled: the sandbox's whole process group is killed.
  So a step's abort never waits on a tool and never leaves one running, and a trajectory cut by the tail cut between
  turns ends as truncated instead of waiting for a resume that comes only after the step. A gate closed for another
  step (a worker's view that has not yet heard the ``open``) cuts nothing; validation rows carry no step and are
  never cut.
* **Resumption** (over-sample ``continue``). A trajectory cut by an abort records a ``TurnBoundary`` in its
  ``extra_fields`` (``RESUME_AT``): the chat, the token count and the turn counters at the start of the stage that
  was cut. The re-queued row's loop fetches the stored trajectory (``recipe.adapter.partial``) and rebuilds verl's
  state from it in ``_handle_pending_state``, so the rest of verl's state machine runs unchanged: an assistant turn
  cut mid-way continues after its stored tokens (``ContinueFrom``) and the whole turn is parsed for tool calls; a
  turn whose tool calls were cancelled (they never replied) issues them again, except parallel calls that had
  answered before the cut: their stored replies are used; a trajectory cut after a tool reply starts its next
  turn. Completed tool calls are never re-run (their replies are in the stored tokens, mask 0); the
  trained trajectory is the stored one plus its continuation, and the budget counts the stored tokens (stored tokens
  already past this step's cap end the trajectory as it is, uncut). A session that had finished is returned as it
  was. Text-only: a multimodal model's images are not restored.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import asdict, dataclass, field
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
from verl.experimental.agent_loop.tool_agent_loop import AgentData, AgentState, ToolAgentLoop
from verl.experimental.agent_loop.tool_parser import FunctionCall
from verl.tools.schemas import ToolResponse

from ..core.seeds import turn_seed
from .agent_loop import row_int
from .fields import CAP, PARTIAL, ROLLOUT_STEP, SEED
from .partial import RESUME_AT, ContinueFrom, PartialRef, StoredResponse, fetch_partial, mask_stale
from .rollout_gate import GateWatch, gate_watch
from .router import group_request_id
from .routes import NewRoutesOnly, finish_routes
from .turns import TOOL_CALLS

logger = logging.getLogger(__name__)

TOOL_AGENT_LOOP_NAME = "length_capped_tool_agent"
ABORTED = "aborted"
GENERATE, TOOLS = "generate", "tools"  # the stage an abort cut


@dataclass
class TurnBoundary:
    """Where a trajectory cut by an abort resumes: verl's loop state at the start of the stage that was cut.

    ``GENERATE``: an assistant turn (maybe still empty) was cut; the stored response tokens after ``tokens`` are its
    first part. ``TOOLS``: a finished turn's tool calls (``pending_calls``) never replied; they are issued again. The
    tokens, mask and log-probs are not copied here: they are the trajectory's stored response.
    """

    stage: str
    tokens: int  # response tokens before the stage
    assistant_turns: int
    user_turns: int
    messages: list  # the chat after the prompt, up to the stage
    extra_fields: dict  # verl's per-turn server fields so far (the policy versions)
    metrics: dict = field(default_factory=dict)  # verl's timings so far (tool seconds feed the time key)
    turn_scores: list = field(default_factory=list)
    tool_rewards: list = field(default_factory=list)
    tool_calls_done: int = 0  # calls whose replies joined the trajectory (extra_fields[TOOL_CALLS])
    pending_calls: list = field(default_factory=list)  # TOOLS: verl FunctionCall fields
    # TOOLS: the stage's parallel calls that had answered when a sibling was cancelled ({"index", "text", "reward"});
    # the resume returns these replies instead of running the calls again
    answered_calls: list = field(default_factory=list)


class _TurnClient(NewRoutesOnly):
    """verl's server client for one trajectory: adds the row's priority, remembers how the last turn ended and, with
    routing replay, asks each turn for its new tokens' routes only (``recipe.adapter.routes.NewRoutesOnly``)."""

    def __init__(self, inner, priority: int):
        super().__init__(inner)
        self.priority = priority

    async def generate(self, request_id, **kwargs):
        if self.priority:
            kwargs["priority"] = self.priority
        return await super().generate(request_id, **kwargs)


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
        full, cap = self.response_length, row_int(kwargs.get(CAP))
        if 0 < cap < full:
            self.response_length = cap
        seed = row_int(kwargs.get(SEED), absent=-1)
        self._seed = (seed, int(kwargs["session_id"])) if seed >= 0 else None
        step = kwargs.get(ROLLOUT_STEP)
        self._step = None if step is None else row_int(step)  # None: a validation row, never cut by the gate
        self._tool_calls = 0
        self._answers: dict[int, tuple] = {}  # the tool stage's replies so far, by call index
        self._cut_at: TurnBoundary | None = None  # where an abort cut this run
        self._resumed_from: tuple[StoredResponse, TurnBoundary] | None = None
        self._priority, self._request_id = row_int(priority), None  # the trajectory's (a routes re-prefill reuses them)
        server = self._plain_server = self.server_manager
        self._params = sampling_params
        ref = PartialRef.from_field(kwargs.get(PARTIAL))
        if ref is not None:
            stored, at = await self._fetch_resume(ref, int(kwargs["session_id"]))
            if at is None:  # finished before the abort: nothing to generate
                return await self._routed(self._stale_masked(_as_stored(stored), stored))
            self._resumed_from = (stored, at)
            # never below what the trajectory holds: one already past this step's cap is trained as it is (as a
            # single-turn one is), not cut back to the cap by verl's final cut
            self.response_length = max(self.response_length, min(len(stored.tokens), full))
            server = ContinueFrom(server, stored.tokens[at.tokens:],
                                  stored.logprobs[at.tokens:] if stored.logprobs is not None else None,
                                  complete=False, min_version=ref.min_version, limit=self.response_length,
                                  prompt_len=len(stored.prompt))
        self._client = _TurnClient(server, self._priority)
        self.server_manager = self._client
        self.tool_parser = _SkipAbortedParser(self.tool_parser, self._client)
        self.gate = await gate_watch() if self._step is not None else None
        return await self._routed(self._finish(await super().run(sampling_params, priority=priority, **kwargs)))

    async def _routed(self, output: AgentLoopOutput) -> AgentLoopOutput:
        """With routing replay, routes for every trained token (``recipe.adapter.routes``): a trajectory returned
        from the store, resumed with its budget spent or ending in a tool reply carries none or too few."""
        await finish_routes(output, self._plain_server, self._params, self.config, cut=self._cut_at is not None,
                            request_id=self._request_id, priority=self._priority)
        return output

    def _finish(self, output: AgentLoopOutput) -> AgentLoopOutput:
        output.extra_fields[TOOL_CALLS] = self._tool_calls  # calls whose replies joined the trajectory (the traces)
        if self._cut_at is not None and self._keeps_partials():
            output.extra_fields[RESUME_AT] = asdict(self._cut_at)
        if not output.response_mask:
            # ended before its first token (aborted, or the gate was closed for its step): verl slices the response as
            # ``ids[-len(mask):]``, which is the whole prompt for an empty mask
            output.response_ids, output.response_logprobs = [], None
        return output if self._resumed_from is None else self._stale_masked(output, self._resumed_from[0])

    def _stale_masked(self, output: AgentLoopOutput, stored: StoredResponse) -> AgentLoopOutput:
        mask_stale(output, len(stored.tokens), self.config)
        return output

    def _keeps_partials(self) -> bool:
        """Over-sample ``continue``: a cut trajectory is kept for a resume, so it records where to resume."""
        over_sample = self.config.get("recipe", {}).get("over_sample", {})
        return bool(over_sample.get("enable", False)) and over_sample.get("requeue") == "continue"

    async def _fetch_resume(self, ref: PartialRef, session: int) -> tuple[StoredResponse, TurnBoundary | None]:
        """The stored trajectory and where to resume it (None: it had finished, ``ref.complete`` or never cut)."""
        if self.processor is not None:
            raise ValueError("over-sample requeue 'continue' resumes text-only multi-turn trajectories: a multimodal "
                             "model's prompt and tool images are not restored; use OVER_SAMPLE_REQUEUE=restart")
        stored = await fetch_partial(ref, session, turns=True)
        at = stored.extra_fields.get(RESUME_AT)
        return stored, None if ref.complete[session] or at is None else TurnBoundary(**at)

    async def _handle_pending_state(self, agent_data: AgentData, sampling_params: dict[str, Any]) -> AgentState:
        state = await super()._handle_pending_state(agent_data, sampling_params)
        self._prompt_messages = len(agent_data.messages)
        if self._resumed_from is not None:
            state = self._restore(agent_data, *self._resumed_from)
        self._request_id = agent_data.request_id
        return state

    def _restore(self, agent_data: AgentData, stored: StoredResponse, at: TurnBoundary) -> AgentState:
        """verl's state at ``at`` from the stored trajectory (tool replies keep mask 0); the stage to enter. Its
        requests carry its stored tokens after the prompt: their id names the group's prompt (group affinity)."""
        agent_data.request_id = group_request_id(agent_data.request_id, len(stored.prompt))
        agent_data.prompt_ids = agent_data.prompt_ids + stored.tokens[: at.tokens]
        agent_data.response_mask = stored.mask[: at.tokens]
        agent_data.response_logprobs = stored.logprobs[: at.tokens] if stored.logprobs is not None else []
        agent_data.messages.extend(at.messages)
        agent_data.assistant_turns, agent_data.user_turns = at.assistant_turns, at.user_turns
        agent_data.extra_fields.update(at.extra_fields)
        agent_data.metrics.update(at.metrics)
        agent_data.turn_scores, agent_data.tool_rewards = list(at.turn_scores), list(at.tool_rewards)
        self._tool_calls = at.tool_calls_done
        if at.tokens >= self.response_length:  # this launch's budget is spent already: a tool reply could not join
            return AgentState.TERMINATED
        if at.stage == TOOLS:
            agent_data.tool_calls = [FunctionCall(**call) for call in at.pending_calls]
            self._answers = {a["index"]: (ToolResponse(text=a["text"]), a["reward"], {}) for a in at.answered_calls}
            return AgentState.PROCESSING_TOOLS
        return AgentState.GENERATING

    def _boundary(self, agent_data: AgentData) -> dict:
        """The state a stage starts from, as ``TurnBoundary`` fields (kept only if an abort cuts the stage)."""
        return {"tokens": len(agent_data.response_mask), "assistant_turns": agent_data.assistant_turns,
                "user_turns": agent_data.user_turns, "messages": agent_data.messages[self._prompt_messages:],
                "extra_fields": dict(agent_data.extra_fields)}

    def _cut(self, stage: str, boundary: dict, agent_data: AgentData) -> None:
        """An abort ended the trajectory in ``stage``, begun at ``boundary``: remember where to resume."""
        self._cut_at = TurnBoundary(
            stage=stage, **boundary, metrics=dict(agent_data.metrics), turn_scores=list(agent_data.turn_scores),
            tool_rewards=list(agent_data.tool_rewards), tool_calls_done=self._tool_calls,
            pending_calls=[call.model_dump() for call in agent_data.tool_calls] if stage == TOOLS else [],
            answered_calls=[{"index": i, "text": response.text, "reward": reward}
                            for i, (response, reward, _) in sorted(self._answers.items())] if stage == TOOLS else [])

    async def _handle_generating_state(self, agent_data: AgentData, sampling_params: dict[str, Any],
                                       ignore_termination: bool = False) -> AgentState:
        remaining = self.response_length - len(agent_data.response_mask)
        if remaining <= 0:
            return AgentState.TERMINATED
        boundary = self._boundary(agent_data)
        # this trajectory's step is being aborted: a new turn would wait for (or be refused) a resume
        if self.gate is not None and self.gate.cuts(self._step):
            self._cut(GENERATE, boundary, agent_data)
            return AgentState.TERMINATED
        params = {**sampling_params, "max_tokens": remaining}
        if self._seed is not None:
            params["seed"] = turn_seed(*self._seed, agent_data.assistant_turns)
        state = await super()._handle_generating_state(agent_data, params, ignore_termination)
        if self._client.last_stop_reason == ABORTED:
            self._cut(GENERATE, boundary, agent_data)
            return AgentState.TERMINATED
        return state

    async def _handle_processing_tools_state(self, agent_data: AgentData) -> AgentState:
        calls = len(agent_data.tool_calls[: self.max_parallel_calls])
        state = await self._run_tools(agent_data, calls)
        self._answers = {}  # the next stage's calls are new ones
        if state == AgentState.GENERATING:  # the replies joined the context (verl ends it when they do not fit)
            self._tool_calls += calls
        return state

    async def _call_tool(self, tool_call: FunctionCall, tools_kwargs: dict[str, Any], agent_data: AgentData):
        """One of the stage's calls; each reply is remembered (by the call's index in the turn) so that an abort
        cancelling a parallel sibling keeps it, and a resumed stage returns it instead of running the call again."""
        index = next(i for i, call in enumerate(agent_data.tool_calls) if call is tool_call)
        if index not in self._answers:
            self._answers[index] = await super()._call_tool(tool_call, tools_kwargs, agent_data)
        return self._answers[index]

    async def _run_tools(self, agent_data: AgentData, calls: int) -> AgentState:
        if self.gate is None:
            return await super()._handle_processing_tools_state(agent_data)
        if self.gate.cuts(self._step):
            self._cut(TOOLS, self._boundary(agent_data), agent_data)
            return AgentState.TERMINATED
        tools = asyncio.ensure_future(super()._handle_processing_tools_state(agent_data))
        closed = asyncio.ensure_future(self.gate.wait_cut(self._step))
        try:
            await asyncio.wait({tools, closed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            closed.cancel()
            if not tools.done():  # the gate closed for this step first (or this task was cancelled): stop the tools
                tools.cancel()
                await asyncio.gather(tools, return_exceptions=True)
        if tools.cancelled():
            # a warning, so the run's log shows each cancellation (the e2e test counts them)
            logger.warning("%s: rollout aborted during a tool call: %d call(s) cancelled, the trajectory ends",
                           agent_data.request_id, calls)
            # verl changes the trajectory only once every call has replied: it is as the stage found it
            self._cut(TOOLS, self._boundary(agent_data), agent_data)
            return AgentState.TERMINATED
        return tools.result()


def _as_stored(stored: StoredResponse) -> AgentLoopOutput:
    """A session that had finished before the abort, as it was (verl's worker scores it again like any other)."""
    extra = {k: v for k, v in stored.extra_fields.items() if k != RESUME_AT}
    return AgentLoopOutput(prompt_ids=stored.prompt, response_ids=stored.tokens, response_mask=stored.mask,
                           response_logprobs=stored.logprobs, multi_modal_data={}, num_turns=stored.num_turns,
                           metrics=stored.metrics, extra_fields=extra)
