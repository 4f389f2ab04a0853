"""Routing replay (R3) on the recipe's rollout paths: every trained token's routes, aligned with the tokens.

With ``actor_rollout_ref.rollout.enable_rollout_routing_replay`` verl's server returns, per request, the experts vLLM
routed each forwarded token to (``TokenOutput.routed_experts``, ``(prompt + response - 1, layers, top_k)``: the last
sampled token is never forwarded), and Megatron replays them in R3 (``router_replay_utils.build_r3_replay_mask``:
every row but the last of a sequence with a trained token; a sequence without one keeps Megatron's own routing).
verl's loops keep the last request's routes, which cover a trajectory exactly when that request saw all of it (a
multi-turn turn asks only for its new tokens' routes and hands verl the earlier turns' rows with them:
:class:`NewRoutesOnly`). On the recipe's paths some do not:

* a session of an over-sample ``continue`` group that had already finished is handed back from the store without a
  server call (``ContinueFrom``, a multi-turn trajectory returned as it was, or one resumed with its budget spent);
* a resumed response whose continuation was aborted before its first token returns no routes at all;
* a response cut before its first token (the tail cut) has none, and TransferQueue refuses a batch where some
  trajectories carry ``routed_experts`` and others do not (``kv_batch_get`` raises; Megatron: "micro_batch has no
  routed_experts").

``finish_routes`` closes these at the end of a loop's run, after ``mask_stale_tokens`` has masked what it masks:

* Every trajectory that can be trained leaves with a routes array, a placeholder of no rows when none of its tokens
  is trained (R3 replays no row of such a sequence), so every row of a batch carries the field.
* Uncovered trained tokens are re-prefilled: one request for prompt + response but its last token, ``max_tokens=1``
  (its one sampled token is dropped), whose routes are those of the weights this step serves, the same weights the
  continuation of a resumed response is routed with (vLLM re-prefills the stored part too), and the weights the
  trainer's recomputed log-probs use: the stored tokens' original routes belong to an older policy, and replaying
  them would put the present weights through experts they no longer choose. The request runs at the row's priority
  under the trajectory's request id, marked with its group's prompt (``router.group_request_id``), so it queues with
  its group under ``ROLLOUT_SCHEDULING_POLICY=priority`` and lands where its trajectory and group run (sticky routing,
  group affinity, the prefix cache).
* A trajectory cut by the tail cut's abort (its step is closing; no request may start) is trained as it is: its
  uncovered trained tokens leave the loss (mask 0) instead, counted in ``extra_fields[UNROUTED]`` and the step's
  ``UNROUTED_METRIC``: routes that cannot be known are never replayed.
* A trajectory cut by over-sampling's abort, or whose re-prefill it aborted, is never trained in this step (its group
  lost the race): it keeps its mask as it is (a resume restores it: masking it would drop its turns from every later
  launch) and carries no routes, so none are held in TransferQueue while it waits for its resume, which routes it
  anew.

A server that returns no routes at all is an error, not a masked step; so is a finished prefill that returns fewer
rows than it was asked for (only an abort may cut one short), and routes that were never captured: a MoE layer whose
every expert id is 0 (:func:`check_captured`: a MoE kernel that selects its experts inside itself never calls vLLM's
router, where the capture lives, and vLLM returns its zero-filled buffer; replaying it sends every token to expert 0).

A trained trajectory's routes end where its last trained token's do; the rows after it (a tool reply that ends the
trajectory, tokens masked because their routes could not be had) change no trained log-prob, but verl pads them with
zeros and Megatron replays every row of a trained sequence but its last (``build_r3_replay_mask``): all to expert 0,
one expert's load. They are filled with :func:`spread_rows` instead: every expert in turn, as even as a load can be.
"""
from __future__ import annotations

import functools
import json
import logging
from pathlib import Path
from typing import Any
from uuid import uuid4

import numpy as np

from ..hf_config import text_config
from ..preflight.router_replay import MOE_BACKEND_FIX
from .router import group_request_id

logger = logging.getLogger(__name__)

UNROUTED = "unrouted_masked_tokens"  # extra_fields: trained tokens masked because their routes could not be had
UNROUTED_METRIC = "rollout/routes/unrouted_masked_tokens"  # their sum over the step's trained trajectories
PROMPT_START = "routed_experts_prompt_start"  # vLLM 0.24 SamplingParams: prompt tokens whose routes are not returned
EXPERT_KEYS = ("num_experts", "n_routed_experts", "num_local_experts")
CONCLUSIVE_ROWS = 32  # top_k 1: rows of expert 0 in a layer that no routing gives (chance experts ** -32)


def replay_on(config) -> bool:
    """Whether this run's rollouts return routes (R3): verl's server key, which the recipe's ROUTER_REPLAY sets."""
    rollout = config.get("actor_rollout_ref", {}).get("rollout", {})
    return bool(rollout.get("enable_rollout_routing_replay", False))


def cut_is_not_trained(config) -> bool:
    """Whether a trajectory an abort cut stays out of this step's training: over-sampling aborts only the groups that
    lost the race (dropped, or kept for a resume). The tail cut, which trains what it cuts, never runs beside it."""
    return bool(config.get("recipe", {}).get("over_sample", {}).get("enable", False))


@functools.lru_cache(maxsize=8)
def route_shape(model_path: str) -> tuple[int, int]:
    """(layers, top_k) of a route row, as vLLM's capture sizes it (``num_hidden_layers``, ``num_experts_per_tok``)."""
    hf = text_config(json.loads((Path(model_path) / "config.json").read_text()))
    return int(hf["num_hidden_layers"]), int(hf["num_experts_per_tok"])


@functools.lru_cache(maxsize=8)
def expert_total(model_path: str) -> int:
    """The model's routed experts, under the first key vLLM reads (``routed_experts_capturer.get_num_experts``)."""
    hf = text_config(json.loads((Path(model_path) / "config.json").read_text()))
    for key in EXPERT_KEYS:
        if hf.get(key):
            return int(hf[key])
    raise ValueError(f"routing replay: {model_path}/config.json names no expert count ({' / '.join(EXPERT_KEYS)}): "
                     "not a Mixture-of-Experts model; export ROUTER_REPLAY=off")


def uncaptured_layers(routes) -> list[int]:
    """The layers of ``routes`` (rows, layers, top_k) whose every expert id is 0 where no routing gives that: a
    captured row holds top_k distinct ids, so with top_k >= 2 one such row shows a layer vLLM never wrote; with
    top_k 1 it takes ``CONCLUSIVE_ROWS`` rows (a real routing picks expert 0 for all of them with chance
    experts ** -rows)."""
    routes = np.asarray(routes)
    if routes.ndim != 3 or not len(routes) or (routes.shape[2] < 2 and len(routes) < CONCLUSIVE_ROWS):
        return []
    return np.flatnonzero(~routes.any(axis=(0, 2))).tolist()


def check_captured(out) -> None:
    """Raise when ``out`` (a ``TokenOutput`` that generated tokens) carries routes vLLM never captured (module
    docstring), before they are replayed."""
    if out.routed_experts is None or not out.token_ids:
        return
    layers = uncaptured_layers(out.routed_experts)
    if layers:
        total = np.shape(out.routed_experts)[1]
        raise RuntimeError(
            f"routing replay: vLLM returned expert 0 for every token of {len(layers)} of {total} MoE layers "
            f"({layers[:8]}{' ...' if len(layers) > 8 else ''}) of a request that generated {len(out.token_ids)} "
            "token(s): nothing was captured there. Its MoE kernel selects the experts inside itself and never calls "
            "vLLM's router, where the capture lives (vLLM 0.24 picks FlashInfer's TRT-LLM bf16 MoE kernel on "
            f"Blackwell, SM100); replaying these routes would send every token to expert 0. Fix: {MOE_BACKEND_FIX}, "
            "or ROUTER_REPLAY=R2 / off")


def spread_rows(start: int, stop: int, layers: int, top_k: int, experts: int, dtype) -> np.ndarray:
    """Route rows ``start:stop`` that no trained token depends on (module docstring): row ``r`` sends slot ``j`` of
    every layer to expert ``(r * top_k + j) % experts``, top_k distinct experts a row and each expert in turn."""
    ids = (np.arange(start, stop)[:, None] * top_k + np.arange(top_k)[None, :]) % experts
    return np.broadcast_to(ids[:, None, :], (stop - start, layers, top_k)).astype(dtype)


def covered_tokens(routes, prompt_len: int, response_len: int) -> int:
    """How many response tokens have every route their log-prob depends on: token ``j`` is predicted from row
    ``prompt_len + j - 1`` and attends to all rows before it."""
    rows = 0 if routes is None else len(routes)
    return max(0, min(response_len, rows - prompt_len + 1))


class StopRecorder:
    """A server client that remembers its last request: how it ended (``aborted``: the trajectory was cut), its
    request id and priority (a routes re-prefill reuses them)."""

    def __init__(self, inner):
        self.inner = inner
        self.last_stop_reason: str | None = None
        self.request_id: str | None = None
        self.priority = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def generate(self, request_id, **kwargs):
        self.request_id, self.priority = request_id, int(kwargs.get("priority", 0) or 0)
        out = await self.inner.generate(request_id, **kwargs)
        self.last_stop_reason = out.stop_reason
        check_captured(out)
        return out


class NewRoutesOnly(StopRecorder):
    """A multi-turn trajectory's server client: each turn asks vLLM only for the routes of the tokens it adds.

    Every turn's prompt is the whole conversation so far, and vLLM returns a route row for each of its tokens; verl's
    loop keeps the last turn's, so every turn moved the earlier turns' rows again. vLLM's
    ``SamplingParams.routed_experts_prompt_start`` (``PROMPT_START``; verl's server passes the loop's sampling params
    to ``SamplingParams`` as they are) skips the rows the earlier turns returned, and the reply handed to verl carries
    the held rows plus the new ones. Held rows are reused only while the prompt begins with the tokens they were
    routed for (within one run: one policy); a turn whose context differs there (a re-tokenized turn boundary) asks
    for its whole prompt's routes again."""

    def __init__(self, inner):
        super().__init__(inner)
        self.routes = None  # the trajectory's route rows so far
        self.routed_ids: list[int] = []  # the tokens they were routed for (and the last reply's unforwarded token)

    async def generate(self, request_id, **kwargs):
        prompt, held = list(kwargs["prompt_ids"]), 0 if self.routes is None else len(self.routes)
        start = held if 0 < held < len(prompt) and prompt[:held] == self.routed_ids[:held] else 0
        if start:
            kwargs["sampling_params"] = {**kwargs["sampling_params"], PROMPT_START: start}
        out = await super().generate(request_id, **kwargs)
        if out.routed_experts is None:
            return out
        new = out.routed_experts
        # more rows than the new tokens have: the server returned the whole prompt's (it ignored PROMPT_START)
        if start and len(new) <= len(prompt) + len(out.token_ids) - 1 - start:
            out = out.model_copy(update={"routed_experts": np.concatenate([self.routes, new])})
        self.routes, self.routed_ids = out.routed_experts, prompt + list(out.token_ids)
        return out


async def finish_routes(output, server, sampling_params: dict[str, Any], config, *, cut: bool,
                        request_id: str | None, priority: int = 0) -> None:
    """The loops' last step with routing replay on (module docstring): ``output`` (an ``AgentLoopOutput``, its stale
    tokens already masked) carries routes for every token it trains. ``server``: the loop's plain server client;
    ``cut``: an abort ended the trajectory; ``request_id`` and ``priority``: the trajectory's (None: a fresh id)."""
    if not replay_on(config):
        return
    untrained = cut_is_not_trained(config)
    if cut and untrained:
        output.routed_experts = None
        return
    await cover_routes(output, server, sampling_params, config.actor_rollout_ref.model.path, cut=cut,
                       request_id=request_id, priority=priority, aborted_is_untrained=untrained)


async def cover_routes(output, server, sampling_params: dict[str, Any], model_path: str, *, cut: bool,
                       request_id: str | None = None, priority: int = 0, aborted_is_untrained: bool = False) -> None:
    """Routes for every token ``output`` trains, a re-prefill for those it lacks, or (``cut``: no request may start)
    those tokens masked; a routes array of no rows when it has none and trains nothing. ``aborted_is_untrained``
    (over-sampling): a re-prefill the abort cut means the trajectory's group is not trained this step, which leaves it
    as it was (mask whole, no routes), like a trajectory the abort cut."""
    prompt, response, mask = list(output.prompt_ids), list(output.response_ids), list(output.response_mask)
    covered = covered_tokens(output.routed_experts, len(prompt), len(response))
    if any(mask[covered:]) and (cut or not await _re_prefill(output, server, sampling_params, request_id, priority)):
        if not cut and aborted_is_untrained:
            output.routed_experts = None
            return
        masked = sum(mask[covered:])  # trained tokens only: tool replies in the uncovered part were never trained
        logger.warning("routing replay: %d trained token(s) of a trajectory have no routes (cut by an abort before "
                       "vLLM returned them); they leave the loss", masked)
        output.response_mask = mask[:covered] + [0] * (len(mask) - covered)
        output.extra_fields[UNROUTED] = masked
    if output.routed_experts is None:
        output.routed_experts = np.zeros((0, *route_shape(model_path)), dtype=np.uint8)
    rows, have = len(prompt) + len(response) - 1, len(output.routed_experts)
    if any(output.response_mask) and have < rows:  # the rows after the last trained token's (module docstring)
        routes = output.routed_experts
        output.routed_experts = np.concatenate(
            [routes, spread_rows(have, rows, *routes.shape[1:], expert_total(model_path), routes.dtype)])


async def _re_prefill(output, server, sampling_params: dict[str, Any], request_id: str | None, priority: int) -> bool:
    """Routes for prompt + response from one prefill (module docstring); False when it was aborted first."""
    prompt, response = list(output.prompt_ids), list(output.response_ids)
    # all but the last token: vLLM returns a row for each prompt token, and max_model_len leaves room for one more
    rows = len(prompt) + len(response) - 1
    params = {**sampling_params, "max_tokens": 1, "logprobs": False}
    out = await server.generate(request_id=group_request_id(request_id or uuid4().hex, len(prompt)),
                                prompt_ids=(prompt + response)[:rows], sampling_params=params,
                                **({"priority": priority} if priority else {}))
    check_captured(out)
    if out.routed_experts is not None and len(out.routed_experts) >= rows:
        output.routed_experts = out.routed_experts[:rows]
        return True
    if out.stop_reason == "aborted":
        return False
    if out.routed_experts is None:
        # not an abort: the server returns no routes at all, and masking every response would train on nothing
        raise RuntimeError("routing replay: vLLM returned no routed experts with actor_rollout_ref.rollout."
                           "enable_rollout_routing_replay=True; its server must run with "
                           "enable_return_routed_experts (verl sets it from that key): check the rollout engine "
                           "and its version, or set ROUTER_REPLAY=R2 / off")
    # finished, yet short: vLLM returns a row for every prompt token of a prefill it finishes, so the routes are wrong
    # somewhere; treating it as cut would mask (or leave untrained) a trajectory for an engine fault
    raise RuntimeError(f"routing replay: a routes prefill of {rows} tokens finished ({out.stop_reason}) with "
                       f"{len(out.routed_experts)} route rows, {rows} expected (vLLM returns one per prompt token): "
                       "the rollout engine's routed-experts capture is inconsistent (a vLLM other than the stack's, "
                       "or a routed_experts_prompt_start that skips rows); check the engine or set ROUTER_REPLAY=R2 "
                       "/ off")


def routes_metrics(extra_fields) -> dict[str, float]:
    """The step's ``UNROUTED_METRIC`` from its trained trajectories' ``extra_fields`` (dicts; other values skipped)."""
    return {UNROUTED_METRIC: float(sum(int(e.get(UNROUTED, 0)) for e in extra_fields if isinstance(e, dict)))}
