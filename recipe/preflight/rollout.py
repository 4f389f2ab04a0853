"""The vLLM rollout: replica layout and scheduler limits."""
from __future__ import annotations

from collections.abc import Mapping

from ..rollout_spec import problems as speculative_problems
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
    # verl's vLLM server sizes a context by max_model_len, the model's max_position_embeddings when unset
    model_len = r("max_model_len") or (hf or {}).get("max_position_embeddings") or longest
    if not r("enable_chunked_prefill") and tokens < model_len:
        errors.append(f"ROLLOUT_MAX_NUM_BATCHED_TOKENS={tokens} < max_model_len {model_len} with chunked prefill off: "
                      f"vLLM must fit a whole context in one step; export ROLLOUT_MAX_NUM_BATCHED_TOKENS={model_len}")
    if (select(cfg, "trainer.device") == "cpu" and select(cfg, "recipe.sampling_seed") is not None
            and r("enable_chunked_prefill")):
        # vllm/v1/worker/gpu_model_runner.py _bookkeeping_sync rewinds a seeded request's generator after a partial
        # (chunked) prefill with gen.set_offset, which torch's CPU generator does not support: the engine dies.
        errors.append("actor_rollout_ref.rollout.enable_chunked_prefill=True with ROLLOUT_SAMPLING_SEED on vLLM CPU: "
                      "a chunked prefill of a seeded request crashes the CPU engine; keep chunked prefill off (the "
                      "CPU config's default) or unset ROLLOUT_SAMPLING_SEED")
    # speculative decoding (ROLLOUT_SPECULATIVE or a user's own engine_kwargs.vllm.speculative_config)
    errors.extend(speculative_problems(cfg))


# recipe/drafting/corpus.py's arrays per token held (bench/group_drafter_cost.py, depth 8: 39-43 B on code and prose,
# 52-56 B on random tokens, where every window is new; plus room for a table that has just doubled)
GROUP_BYTES_PER_TOKEN = 72


def group_drafter_memory(cfg: Mapping, errors: list[str], notes: list[str], node_memory: int | None) -> None:
    """``ROLLOUT_SPECULATIVE=group``: each engine's output rank keeps a drafting corpus in host memory (the other TP
    ranks keep none: recipe/drafting/vllm_proposer.py), bounded by the finished texts it keeps
    (``ROLLOUT_SPECULATIVE_SUFFIX_CACHED``) plus the running ones, each up to a prompt and a response long; the bound
    for one node's engines is stated with how many steps of history it holds, and refused above a quarter of the
    node's memory."""
    from ..core.routing_cost import WARN_SHARE_OF_NODE_MEMORY, fmt_bytes
    from ..rollout_spec import GROUP_PROPOSER, KEY

    spec = select(cfg, KEY)
    if not isinstance(spec, Mapping) or spec.get("model") != GROUP_PROPOSER:
        return
    r = lambda k: select(cfg, f"{ARR}.rollout.{k}")  # noqa: E731
    kept = spec.get("suffix_decoding_max_cached_requests", 0)
    tokens = select(cfg, "data.max_prompt_length") + select(cfg, "data.max_response_length")
    per_engine = (kept + r("max_num_seqs")) * tokens * GROUP_BYTES_PER_TOKEN
    engine_gpus = r("tensor_model_parallel_size") * (r("pipeline_model_parallel_size") or 1)
    engines = max(1, select(cfg, "trainer.n_gpus_per_node") // engine_gpus)
    per_node = per_engine * engines
    texts_per_step = (select(cfg, "data.train_batch_size") * r("n")
                      / max(1, engines * (select(cfg, "trainer.nnodes") or 1)))
    what = (f"ROLLOUT_SPECULATIVE=group keeps up to {fmt_bytes(per_node)} of drafting corpus per node ({engines} "
            f"engines x {fmt_bytes(per_engine)}, one corpus per engine on its output rank: "
            "(ROLLOUT_SPECULATIVE_SUFFIX_CACHED + ROLLOUT_MAX_NUM_SEQS) x (MAX_PROMPT_LENGTH + MAX_RESPONSE_LENGTH) x "
            f"{GROUP_BYTES_PER_TOKEN} B, at most: most responses end sooner); its history holds ~{kept / texts_per_step:.0f} "
            "steps of an engine's texts")
    if node_memory and per_node > WARN_SHARE_OF_NODE_MEMORY * node_memory:
        errors.append(f"{what}, more than {WARN_SHARE_OF_NODE_MEMORY:.0%} of this node's {fmt_bytes(node_memory)}: "
                      "lower ROLLOUT_SPECULATIVE_SUFFIX_CACHED (the prompt's history shrinks)")
    else:
        notes.append(what)
