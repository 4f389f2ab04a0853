"""verl's ``SingleTurnAgentLoop`` with the per-row response cap applied as vLLM ``max_tokens``.

Registered through ``configs/agent_loops.yaml`` (``actor_rollout_ref.rollout.agent.agent_loop_config_path``) and
made the default agent loop. The cap arrives as a keyword argument (the row field ``response_max_tokens_cap`` that
the trainer adds on the driver); validation rows never carry it, so validation is never capped.
"""
from __future__ import annotations

from typing import Any

from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

from .fields import CAP

AGENT_LOOP_NAME = "length_capped_single_turn"


def row_cap(value: Any) -> int:
    """The cap a row carries (tensor, numpy or int), 0 when absent."""
    if value is None:
        return 0
    return int(value.item() if hasattr(value, "item") else value)


class CappedSingleTurnAgentLoop(SingleTurnAgentLoop):
    async def run(self, sampling_params: dict[str, Any], **kwargs) -> Any:
        cap = row_cap(kwargs.get(CAP))
        if 0 < cap < self.response_length:
            # verl shares one sampling_params dict between the n responses of a prompt: never mutate it.
            sampling_params = {**sampling_params, "max_tokens": cap}
        return await super().run(sampling_params, **kwargs)
