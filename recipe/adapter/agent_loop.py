"""verl's ``SingleTurnAgentLoop`` with the per-row response cap, per-response seeds and partial-rollout resumption.

Registered through ``configs/agent_loops.yaml`` (``actor_rollout_ref.rollout.agent.agent_loop_config_path``) and
made the default agent loop. Both inputs arrive as keyword arguments (row fields the trainer adds on the driver):
``response_max_tokens_cap`` becomes vLLM ``max_tokens``; ``sampling_seed`` (with ``recipe.sampling_seed``) becomes
the response's vLLM ``seed`` (with the sample index mixed in); ``partial_rollout`` (over-sample ``continue`` mode) makes
the run resume a response aborted in an earlier step. Validation rows carry neither, so validation is never capped
or resumed. With routing replay (R3) every trained token gets its routes (``recipe.adapter.routes``), after the stale
tokens are masked (a response that trains nothing costs no re-prefill).
"""
from __future__ import annotations

from typing import Any

from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

from ..core.seeds import response_seed
from .fields import CAP, PARTIAL, SEED
from .partial import ContinueFrom, PartialRef, fetch_partial, mask_stale
from .routes import StopRecorder, finish_routes

AGENT_LOOP_NAME = "length_capped_single_turn"


def row_int(value: Any, absent: int = 0) -> int:
    """An integer row field (tensor, numpy or int) as verl hands it to ``run``; ``absent`` when missing."""
    if value is None:
        return absent
    return int(value.item() if hasattr(value, "item") else value)


class CappedSingleTurnAgentLoop(SingleTurnAgentLoop):
    async def run(self, sampling_params: dict[str, Any], **kwargs) -> Any:
        cap = row_int(kwargs.get(CAP))
        limit = self.response_length
        # verl shares one sampling_params dict between the n responses of a prompt: never mutate it.
        if 0 < cap < self.response_length:
            sampling_params = {**sampling_params, "max_tokens": cap}
            limit = cap
        seed = row_int(kwargs.get(SEED), absent=-1)
        if seed >= 0:
            sampling_params = {**sampling_params, "seed": response_seed(seed, int(kwargs["session_id"]))}
        plain = self.server_manager
        ref = PartialRef.from_field(kwargs.get(PARTIAL))
        if ref is not None:
            session = int(kwargs["session_id"])
            stored = await fetch_partial(ref, session)
            self.server_manager = ContinueFrom(plain, stored.tokens, stored.logprobs, complete=ref.complete[session],
                                               min_version=ref.min_version, limit=limit)
        self.server_manager = client = StopRecorder(self.server_manager)
        output = await super().run(sampling_params, **kwargs)
        if ref is not None:
            mask_stale(output, len(stored.tokens), self.config)
        # a finished session handed back from the store, or a continuation aborted at once, carries no routes
        await finish_routes(output, plain, sampling_params, self.config, cut=client.last_stop_reason == "aborted",
                            request_id=client.request_id, priority=client.priority)
        return output
