"""Multi-turn (tool-calling) rollouts in the simulator (issue 18 item 7): traces, an engine model in which a
trajectory leaves the engine during each tool call, and the driver that replays them through the same policies.

**Trajectory** (one GRPO response of an agent loop, e.g. verl's ``ToolAgentLoop``): assistant turn 0, tool call 0,
assistant turn 1, ..., assistant turn T-1 (a tool call follows every assistant turn but the last). Stored as
interleaved segments ``seg[..., 2k]`` = assistant tokens of turn k, ``seg[..., 2k+1]`` = tokens of tool k's output
(0: no such tool call), and ``lat[..., k]`` = tool k's latency in seconds. The response budget
(``response_length``, or a cap) counts assistant + tool tokens, as verl's ``response_length`` does for the response
mask of a multi-turn trajectory: the segments are clipped in order (``clip_budget``); a turn cut by the budget makes
no tool call, a tool output that overflows is cut and ends the trajectory when the tool returns.

**Shapes** (``MT_SHAPES``, stated assumptions, not calibrated on any run): per prompt a difficulty ``z ~ N(0, 1)``
that random-walks between epochs (``epoch_sigma`` per epoch); per trajectory ``1 + Binomial(max_calls - 1,
sigmoid(calls_logit + calls_coef z))`` tool calls, so harder prompts make more calls; assistant turns lognormal
around ``turn_median x exp(between_sigma z)`` (harder prompts: longer turns) with ``within_sigma`` per turn; tool
outputs lognormal around ``tool_tokens_median``; tool latencies per call, log-uniform on 0.5-10 s (reference) or
lognormal with a long tail (held-out). ``mt-reference``: 1-8 tool calls, 0.5-10 s. ``mt-heldout`` (not tuned on):
1-12 tool calls, easy prompts few and hard ones many (steeper in z), shorter turns, longer tool outputs, tool latency
lognormal (median 3 s, log-sd 1.0, 0.2-60 s).

**Engine** (``simulate_mt_step``; the same ``EngineParams`` as ``recipe.sim.engine``): every trajectory of a step is
submitted at t=0 and routed by verl's least-in-flight rule (``engine.assign_replicas``); its later turns stay on that
replica (verl's sticky sessions). A replica runs at most ``max_num_seqs`` sequences; waiting sequences are admitted
FCFS (a trajectory back from a tool joins the back of the queue) or by priority. An admitted turn first prefills its
whole context (prompt + every earlier segment) at ``prefill_tok_s`` per token, stalling the replica's decoding, then
decodes its assistant tokens one per decode step of ``a + b * running + c * context``. When the turn ends the
sequence **leaves the engine** (its slot is free at once) for the tool's latency; **its KV is assumed dropped**
(``reprefill="full"``, default: a long tool wait under load evicts it, and vLLM's prefix cache is not counted on),
so on return it **prefills its whole context again**. ``reprefill="new"`` is the optimistic alternative (the prefix
survives, only the tool output is prefilled). A tool returning mid-step joins the queue after that step.

**Left out**: the KV-cache capacity, admission and preemption (``kv_tokens`` is ignored here: the trajectories of a
step are assumed to fit), chunked prefill budgets (a prefill stalls the whole replica), tool-side queueing and
failures (latencies are independent draws), tool-call parsing and reward time, a tool output's dependence on what
was said, the turn that a tool call's result changes (lengths are drawn up front), verl's per-turn
``max_assistant_turns`` / ``max_user_turns`` limits (the turn counts stay in range by construction), and the time the
agent-loop worker itself spends between turns.

**Aborts** (over-sample losers, the tail cut) can hit a trajectory mid-turn, waiting in the queue, or mid-tool.
Trained (the tail cut): it keeps what it has (every completed segment plus the partial turn), truncated. ``restart``:
everything is thrown away and the prompt is drawn afresh later. ``continue``: it resumes from its **last turn
boundary**: the partial assistant turn is discarded (regenerated from its start, with the same length: the trace's
draw is kept), completed tool calls are not re-run (their outputs are in the context, re-prefilled on resume), and a
tool call that was in flight at the abort is issued again (its latency is paid again).

Ordering by expected time (issue 18 item 6): ``MTOptions(order_by="time")`` sorts an epoch by
``recipe.core.ordering.expected_time_key``: the row's token estimate plus its tool-call estimate times the mean tool
latency the run has observed, in tokens (times ``tokens_per_s``), through the trainer's own
``recipe.core.time_key.TimeKeyEstimates``. Everything else (estimates, caps, the cut, over-sampling) is the
single-turn ``Policy`` from ``recipe.sim.policies`` unchanged, on trajectory totals.

Modules: :mod:`.trace` (shapes and draws), :mod:`.engine` (the replica model), :mod:`.run` (policies and the driver),
``python -m recipe.sim.multiturn`` (:mod:`.__main__`).
"""
from __future__ import annotations

from .engine import REPREFILL, simulate_mt_step, simulate_replica
from .run import (MT_CONTINUE_RATIO, MT_DEFAULT_POLICIES, MT_POLICIES, MT_RESTART_RATIO, MT_TOKENS_PER_S, MTOptions,
                  MTPolicy, register_mt, run_mt_policy, simulate_mt)
from .trace import MT_SHAPES, MTShape, MTTrace, clip_budget, from_turns, generate_mt, segment_count

__all__ = ["MTShape", "MT_SHAPES", "MTTrace", "generate_mt", "clip_budget", "segment_count", "from_turns",
           "REPREFILL", "simulate_replica", "simulate_mt_step", "MTOptions", "MTPolicy", "MT_POLICIES", "register_mt",
           "run_mt_policy", "simulate_mt", "MT_DEFAULT_POLICIES", "MT_RESTART_RATIO", "MT_CONTINUE_RATIO",
           "MT_TOKENS_PER_S"]
