"""Partial rollout (over-sample ``continue`` mode): resuming aborted responses where they stopped.

When over-sampling aborts a group in ``continue`` mode, its n partial responses stay in TransferQueue under their
trajectory keys ``{uid}_{session}_0`` and the row is re-queued at the front of the epoch. The next time the row is
launched it carries a small JSON descriptor (``PartialRef``); each of its agent loops fetches its own session's
record (``fetch_partial``) and continues generating from ``prompt + partial`` through ``ContinueFrom``, a wrapper
around verl's LLM server client, so verl's loops are reused unchanged: to them the server simply returned the whole
turn. A session that had already finished (EOS or its length limit) is returned as it was.

Multi-turn trajectories (``CappedToolAgentLoop``) also record, when an abort cuts them, where to resume: a
turn-boundary snapshot in their ``extra_fields`` under ``RESUME_AT`` (the driver reads it too: such a trajectory is
unfinished even if its last token is an EOS, e.g. a tool-call turn whose tool was cancelled).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from verl.workers.rollout.replica import TokenOutput

from .router import group_request_id

RESUME_AT = "resume_at"  # extra_fields key: a multi-turn trajectory's turn-boundary snapshot, set only when cut
STALE = "stale_tokens"  # extra_fields key: response tokens an earlier launch generated (an older policy's)


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


@dataclass
class StoredResponse:
    """One session's aborted record as TransferQueue holds it. The multi-turn fields (``turns=True``) are what a
    trajectory needs to be rebuilt or returned as it was; single-turn resumes read the tokens only."""

    tokens: list[int]
    logprobs: list[float] | None
    prompt: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    num_turns: int = 0
    metrics: dict = field(default_factory=dict)
    extra_fields: dict = field(default_factory=dict)


TURN_FIELDS = ["prompts", "response_mask", "num_turns", "metrics", "extra_fields"]


async def fetch_partial(ref: PartialRef, session: int, turns: bool = False) -> StoredResponse:
    """This session's partial tokens (and their rollout log-probs; with ``turns`` the multi-turn fields too)."""
    import transfer_queue as tq

    fields = ["responses"] + (["rollout_log_probs"] if ref.has_logprobs else []) + (TURN_FIELDS if turns else [])
    data = await tq.async_kv_batch_get(keys=[ref.key(session)], partition_id=ref.partition_id, select_fields=fields)
    out = StoredResponse(tokens=[int(t) for t in _first_row(data["responses"])],
                         logprobs=_logprobs(data) if ref.has_logprobs else None)
    if turns:
        out.prompt = [int(t) for t in _first_row(data["prompts"])]
        out.mask = [int(m) for m in _first_row(data["response_mask"])]
        out.num_turns = int(_first_item(data["num_turns"]))
        out.metrics = dict(_first_item(data["metrics"]))
        out.extra_fields = dict(_first_item(data["extra_fields"]))
    return out


def _logprobs(data) -> list[float]:
    """The stored rollout log-probs; verl stores none for a response cut before its first token."""
    return [float(x) for x in _first_row(data["rollout_log_probs"])] if "rollout_log_probs" in data.keys() else []


def _first_row(value) -> list:
    row = value.unbind()[0] if getattr(value, "is_nested", False) else value[0]
    return row.tolist()


def _first_item(value) -> Any:
    """The first entry of a non-tensor column (TransferQueue hands back a stack, a list or a tensor)."""
    return value.tolist()[0] if hasattr(value, "tolist") else value[0]


def mask_stale(output, stored_tokens: int, config) -> None:
    """A resumed trajectory's stored tokens (an older policy's) are counted in ``extra_fields[STALE]`` (their rollout
    log-probs measure that policy: ``rollout/mismatch/*`` leaves them out); with
    ``recipe.over_sample.mask_stale_tokens`` they also leave the loss (mask 0)."""
    stale = min(stored_tokens, len(output.response_mask))
    output.extra_fields[STALE] = stale
    if config.get("recipe", {}).get("over_sample", {}).get("mask_stale_tokens", False):
        output.response_mask = [0] * stale + list(output.response_mask[stale:])


class ContinueFrom:
    """Wraps verl's server client for one agent loop: its first generation resumes after ``tokens``.

    ``limit`` is the response budget of this run (the cap or response_length); a request's own ``max_tokens`` (a
    multi-turn loop's per-turn budget) narrows it. The continuation asks for the rest, under a request id that names
    its group's prompt (``prompt_len``; None: the prompt_ids it is called with) for the group-affinity router. Only
    the first call continues: the next turns of a multi-turn trajectory go to the server as they are.
    """

    def __init__(self, inner, tokens: list[int], logprobs: list[float] | None, *, complete: bool, min_version: int,
                 limit: int, prompt_len: int | None = None):
        self.inner, self.tokens, self.logprobs = inner, tokens, logprobs
        self.complete, self.min_version, self.limit = complete, min_version, limit
        self.prompt_len = prompt_len
        self.spent = False

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs) -> TokenOutput:
        if self.spent:
            return await self.inner.generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params,
                                             **kwargs)
        self.spent = True
        versions = {"global_steps": self.min_version, "min_global_steps": self.min_version,
                    "max_global_steps": self.min_version}
        limit = min(self.limit, sampling_params.get("max_tokens", self.limit))
        if self.complete or len(self.tokens) >= limit:
            return TokenOutput(token_ids=list(self.tokens), log_probs=self.logprobs, stop_reason="completed",
                               extra_fields=versions)
        params = dict(sampling_params)
        params["max_tokens"] = limit - len(self.tokens)
        group = len(prompt_ids) if self.prompt_len is None else self.prompt_len
        out = await self.inner.generate(group_request_id(request_id, group), prompt_ids=list(prompt_ids) + self.tokens,
                                        sampling_params=params, **kwargs)
        # an empty continuation (aborted again at once) may come without log-probs: the stored ones still count
        has_logprobs = self.logprobs is not None and (out.log_probs or not out.token_ids)
        log_probs = self.logprobs + list(out.log_probs or []) if has_logprobs else None
        extra = {**versions, **out.extra_fields}
        extra["min_global_steps"] = min(self.min_version, out.extra_fields.get("min_global_steps", self.min_version))
        return out.model_copy(update={"token_ids": self.tokens + list(out.token_ids), "log_probs": log_probs,
                                      "extra_fields": extra})
