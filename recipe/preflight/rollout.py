"""The vLLM rollout: replica layout and scheduler limits."""
from __future__ import annotations

from collections.abc import Mapping

from ..settings import select
from .knobs import ARR


def check_rollout(cfg: Mapping, hf: dict | None, world: int, errors: list[str]) -> None:
    """vLLM replica layout and scheduler limits, which verl and vLLM only meet when the servers start."""
    r = lambda k: select(cfg, f"{ARR}.rollout.{k}")  # noqa: E731
    tp, dp, ep, rpp = r("tensor_model_parallel_size"), r("data_parallel_size"), r("expert_parallel_size"), \
        r("pipeline_model_parallel_size") or 1
    if ep > 1 and ep != tp * dp:
        errors.append(f"ROLLOUT_EP={ep} must equal ROLLOUT_TP={tp} x ROLLOUT_DP={dp} = {tp * dp} when > 1 (verl's "
                      f"vLLM rollout); export ROLLOUT_EP={tp * dp} or ROLLOUT_EP=1")
    if world % (tp * dp * rpp):
        errors.append(f"ROLLOUT_TP={tp} x ROLLOUT_DP={dp} = {tp * dp * rpp} GPUs per vLLM replica does not divide the "
                      f"{world} GPUs: verl would leave GPUs without a replica; choose sizes that divide {world}")
    longest = select(cfg, "data.max_prompt_length") + select(cfg, "data.max_response_length")
    if hf is not None:
        if hf["num_attention_heads"] % tp:
            errors.append(f"ROLLOUT_TP={tp} must divide num_attention_heads={hf['num_attention_heads']} (vLLM)")
        limit = hf.get("max_position_embeddings")
        if isinstance(limit, int) and longest > limit:
            errors.append(f"MAX_PROMPT_LENGTH + MAX_RESPONSE_LENGTH = {longest} exceeds the model's "
                          f"max_position_embeddings={limit} (MODEL_PATH config.json): vLLM would refuse the context")
    util = r("gpu_memory_utilization")
    if not 0 < util <= 1:
        errors.append(f"ROLLOUT_GPU_MEMORY_UTILIZATION={util} must be in (0, 1]")
    tokens, seqs = r("max_num_batched_tokens"), r("max_num_seqs")
    if tokens < seqs:
        errors.append(f"ROLLOUT_MAX_NUM_BATCHED_TOKENS={tokens} < ROLLOUT_MAX_NUM_SEQS={seqs}: vLLM's scheduler needs "
                      "at least one token per running sequence per step")
    if not r("enable_chunked_prefill") and tokens < longest:
        errors.append(f"ROLLOUT_MAX_NUM_BATCHED_TOKENS={tokens} < MAX_PROMPT_LENGTH + MAX_RESPONSE_LENGTH = {longest} "
                      "with chunked prefill off: vLLM must fit a whole context in one step")
