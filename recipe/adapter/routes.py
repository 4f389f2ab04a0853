"""Routing replay (R3) on the recipe's rollout paths: every trained token's routes, aligned with the tokens.

With ``actor_rollout_ref.rollout.enable_rollout_routing_replay`` verl's server returns, per request, the experts vLLM
routed each forwarded token to (``TokenOutput.routed_experts``, ``(prompt + response - 1, layers, top_k)``: the last
sampled token is never forwarded), and Megatron replays them in R3 (``router_replay_utils.build_r3_replay_mask``:
every row but the last of a sequence with response tokens). verl's loops keep the last request's routes, which cover
a trajectory exactly when that request saw all of it. On the recipe's paths some do not:

* a session of an over-sample ``continue`` group that had already finished is handed back from the store without a
  server call (``ContinueFrom``, a multi-turn trajectory returned as it was, or one resumed with its budget spent);
* a resumed response whose continuation was aborted before its first token returns no routes at all;
* a response cut before its first token (the tail cut) has none, and TransferQueue refuses a batch where some
  trajectories carry ``routed_experts`` and others do not (``kv_batch_get`` raises).

``cover_routes`` closes these at the end of a loop's run. Uncovered trained tokens are re-prefilled: one request for
prompt + response but its last token, ``max_tokens=1`` (its one sampled token is dropped), whose routes are those of
the weights this step serves, the same weights the continuation of a resumed response is routed with (vLLM
re-prefills the stored part too), and the weights the trainer's recomputed log-probs use: the stored tokens'
original routes belong to an older policy, and replaying them would put the present weights through experts they no
longer choose. When the trajectory was cut by an abort (its step is closing; no request may start) the uncovered
tokens leave the loss (mask 0) instead: routes that cannot be known are never replayed. An empty response gets a
routes array of no rows (the replay mask skips such a sequence). A server that returns no routes at all is an error,
not a masked step.
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

logger = logging.getLogger(__name__)

UNROUTED = "unrouted_masked_tokens"  # extra_fields: trained tokens masked because their routes could not be had


def replay_on(config) -> bool:
    """Whether this run's rollouts return routes (R3): verl's server key, which the recipe's ROUTER_REPLAY sets."""
    rollout = config.get("actor_rollout_ref", {}).get("rollout", {})
    return bool(rollout.get("enable_rollout_routing_replay", False))


@functools.lru_cache(maxsize=8)
def route_shape(model_path: str) -> tuple[int, int]:
    """(layers, top_k) of a route row, as vLLM's capture sizes it (``num_hidden_layers``, ``num_experts_per_tok``)."""
    hf = text_config(json.loads((Path(model_path) / "config.json").read_text()))
    return int(hf["num_hidden_layers"]), int(hf["num_experts_per_tok"])


def covered_tokens(routes, prompt_len: int, response_len: int) -> int:
    """How many response tokens have every route their log-prob depends on: token ``j`` is predicted from row
    ``prompt_len + j - 1`` and attends to all rows before it."""
    rows = 0 if routes is None else len(routes)
    return max(0, min(response_len, rows - prompt_len + 1))


class StopRecorder:
    """A server client that remembers how its last request ended (``aborted``: the trajectory was cut)."""

    def __init__(self, inner):
        self.inner = inner
        self.last_stop_reason: str | None = None

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def generate(self, request_id, **kwargs):
        out = await self.inner.generate(request_id, **kwargs)
        self.last_stop_reason = out.stop_reason
        return out


async def cover_routes(output, server, sampling_params: dict[str, Any], model_path: str, *, cut: bool) -> None:
    """Make ``output`` (an ``AgentLoopOutput``) carry routes for every token it trains (module docstring).

    ``server`` is the loop's server client (a request through it is a plain one); ``cut``: an abort ended the
    trajectory, so no request is sent."""
    prompt, response, mask = list(output.prompt_ids), list(output.response_ids), list(output.response_mask)
    if not response:
        if output.routed_experts is None:
            output.routed_experts = np.zeros((0, *route_shape(model_path)), dtype=np.uint8)
        return
    covered = covered_tokens(output.routed_experts, len(prompt), len(response))
    if not any(mask[covered:]):
        return
    if not cut:
        # all but the last token: vLLM returns a row for each prompt token, and max_model_len leaves room for one more
        rows = len(prompt) + len(response) - 1
        params = {**sampling_params, "max_tokens": 1, "logprobs": False}
        out = await server.generate(request_id=uuid4().hex, prompt_ids=(prompt + response)[:rows],
                                    sampling_params=params)
        if out.routed_experts is not None and len(out.routed_experts) >= rows:
            output.routed_experts = out.routed_experts[:rows]
            return
        if out.routed_experts is None and out.stop_reason != "aborted":
            # not an abort: the server returns no routes at all, and masking every response would train on nothing
            raise RuntimeError("routing replay: vLLM returned no routed experts with actor_rollout_ref.rollout."
                               "enable_rollout_routing_replay=True; its server must run with "
                               "enable_return_routed_experts (verl sets it from that key): check the rollout engine "
                               "and its version, or set ROUTER_REPLAY=R2 / off")
    masked = sum(mask[covered:])
    logger.warning("routing replay: %d trained token(s) of a trajectory have no routes (cut by an abort before "
                   "vLLM returned them); they leave the loss", masked)
    output.response_mask = mask[:covered] + [0] * (len(mask) - covered)
    output.extra_fields[UNROUTED] = masked
    if output.routed_experts is None:
        output.routed_experts = np.zeros((0, *route_shape(model_path)), dtype=np.uint8)
