"""Partial rollout (over-sample ``continue`` mode): resuming aborted responses where they stopped.

When over-sampling aborts a group in ``continue`` mode, its n partial responses stay in TransferQueue under their
trajectory keys ``{uid}_{session}_0`` and the row is re-queued at the front of the epoch. The next time the row is
launched it carries a small JSON descriptor (``PartialRef``); each of its agent loops fetches its own session's
tokens and continues generating from ``prompt + partial`` through ``ContinueFrom``, a wrapper around verl's LLM
server client, so verl's ``SingleTurnAgentLoop.run`` is reused unchanged: to it the server simply returned the
whole response. A session that had already finished (EOS or its length limit) is returned as it was.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from verl.workers.rollout.replica import TokenOutput


@dataclass
class PartialRef:
    key_prefix: str  # uid of the aborted group: its sessions are {key_prefix}_{s}_0
    partition_id: str
    complete: list[bool]  # per session: already finished, nothing to generate
    min_version: int  # oldest policy version (global step) that generated these tokens
    resumes: int  # how many times this row has been resumed already (this launch included)
    has_logprobs: bool

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_field(cls, value: Any) -> "PartialRef | None":
        if value is None:
            return None
        value = value.item() if hasattr(value, "item") and not isinstance(value, str) else value
        return cls(**json.loads(value)) if value else None

    def key(self, session: int) -> str:
        return f"{self.key_prefix}_{session}_0"


async def fetch_partial(ref: PartialRef, session: int) -> tuple[list[int], list[float] | None]:
    """This session's partial tokens (and their rollout log-probs) from TransferQueue."""
    import transfer_queue as tq

    fields = ["responses", "rollout_log_probs"] if ref.has_logprobs else ["responses"]
    data = await tq.async_kv_batch_get(keys=[ref.key(session)], partition_id=ref.partition_id, select_fields=fields)
    tokens = [int(t) for t in _first_row(data["responses"])]
    logprobs = [float(x) for x in _first_row(data["rollout_log_probs"])] if ref.has_logprobs else None
    return tokens, logprobs


def _first_row(value) -> list:
    row = value.unbind()[0] if getattr(value, "is_nested", False) else value[0]
    return row.tolist()


class ContinueFrom:
    """Wraps verl's server client for one agent loop: generation resumes after ``tokens``.

    ``limit`` is the response budget of this run (the cap or response_length); the continuation asks for the rest.
    """

    def __init__(self, inner, tokens: list[int], logprobs: list[float] | None, *, complete: bool, min_version: int,
                 limit: int):
        self.inner, self.tokens, self.logprobs = inner, tokens, logprobs
        self.complete, self.min_version, self.limit = complete, min_version, limit

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs) -> TokenOutput:
        versions = {"global_steps": self.min_version, "min_global_steps": self.min_version,
                    "max_global_steps": self.min_version}
        if self.complete or len(self.tokens) >= self.limit:
            return TokenOutput(token_ids=list(self.tokens), log_probs=self.logprobs, stop_reason="completed",
                               extra_fields=versions)
        params = dict(sampling_params)
        params["max_tokens"] = self.limit - len(self.tokens)
        out = await self.inner.generate(request_id, prompt_ids=list(prompt_ids) + self.tokens,
                                        sampling_params=params, **kwargs)
        log_probs = self.logprobs + list(out.log_probs) if self.logprobs is not None and out.log_probs else None
        extra = {**versions, **out.extra_fields}
        extra["min_global_steps"] = min(self.min_version, out.extra_fields.get("min_global_steps", self.min_version))
        return out.model_copy(update={"token_ids": self.tokens + list(out.token_ids), "log_probs": log_probs,
                                      "extra_fields": extra})
