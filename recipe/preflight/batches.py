"""Batch divisibility, token budgets, and a cap setting that would measure nothing."""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..settings import select
from .knobs import ARR, MEG


def check_batches(cfg: Mapping, dp: int | None, errors: list[str]) -> None:
    """Batch divisibility and token budgets that verl skips with dynamic batch sizes (or pads around silently)."""
    train_bs, n = select(cfg, "data.train_batch_size"), select(cfg, f"{ARR}.rollout.n")
    mini = select(cfg, f"{ARR}.actor.ppo_mini_batch_size")
    if mini > train_bs or train_bs % mini:
        errors.append(f"TRAIN_BATCH_SIZE={train_bs} is not a multiple of ACTOR_PPO_MINI_BATCH_SIZE={mini}: verl "
                      "would pad the step with dummy rows to fill the last mini-batch; make the mini-batch divide it")
    if dp and (mini * n) % dp:
        errors.append(f"ACTOR_PPO_MINI_BATCH_SIZE={mini} x ROLLOUT_N={n} = {mini * n} responses per update do not "
                      f"split over the {dp} data-parallel ranks (GPUs / (ACTOR_TP x ACTOR_PP x ACTOR_CP)); verl would "
                      "pad with dummy rows: choose a mini-batch whose x ROLLOUT_N is a multiple of the DP size")
    longest = select(cfg, "data.max_prompt_length") + select(cfg, "data.max_response_length")
    cp = select(cfg, f"{MEG}.context_parallel_size") or 1  # FSDP (CPU preset): none
    budgets = (("ACTOR_PPO_MAX_TOKEN_LEN_PER_GPU", "actor.ppo_max_token_len_per_gpu", "actor.use_dynamic_bsz"),
               ("LOG_PROB_MAX_TOKEN_LEN_PER_GPU", "rollout.log_prob_max_token_len_per_gpu",
                "rollout.log_prob_use_dynamic_bsz"),
               ("LOG_PROB_MAX_TOKEN_LEN_PER_GPU", "ref.log_prob_max_token_len_per_gpu", "ref.log_prob_use_dynamic_bsz"))
    for var, key, dynamic in budgets:
        budget = select(cfg, f"{ARR}.{key}")
        if select(cfg, f"{ARR}.{dynamic}") and budget is not None and budget * cp < longest:
            errors.append(f"{var}={budget} ({ARR}.{key}) x ACTOR_CP={cp} < MAX_PROMPT_LENGTH + MAX_RESPONSE_LENGTH = "
                          f"{longest}: verl's dynamic batching needs one full sequence per micro-batch; set it to >= "
                          f"{math.ceil(longest / cp)}")


def cap_note(cfg: Mapping, notes: list[str]) -> None:
    """Not an error, but a comparison arm that measures nothing."""
    cap, response = select(cfg, "recipe.cap", {}) or {}, select(cfg, "data.max_response_length")
    if is_on(cap.get("enable")) and cap.get("mode") == "seed" and cap.get("min_tokens", 0) >= response:
        notes.append(f"VLLM_ROLLOUT_EARLY_STOP_MIN_TOKENS={cap.get('min_tokens')} >= MAX_RESPONSE_LENGTH={response}: "
                     "the seed cap can never shorten a response")


def is_on(value: Any) -> bool:
    """A switch of the composed config, read leniently for notes and the summary: it never raises, since
    ``prepare_config`` has already reported a bad value."""
    return str(value).lower() in ("1", "true")
