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


# recipe/drafting/corpus.py's arrays per token held at an epoch's end after eviction (capacity, stale windows and the
# re-indexes in progress included): 93-182 B on math-like, code and random text at epochs 2-4
# (bench/group_corpus_bytes.py), 217 B where a whole epoch's groups finish in one batch
# (tests/spec/test_corpus_bound.py); the worst, rounded up
GROUP_BYTES_PER_TOKEN = 224
# its numba kernels at engine start-up, CPU seconds (bench/group_corpus_bytes.py): compiled by a node's first engine,
# loaded from numba's cache by the others
GROUP_KERNELS_COMPILE_S, GROUP_KERNELS_LOAD_S = 2.0, 0.2


def group_drafter_memory(cfg: Mapping, errors: list[str], notes: list[str], node_memory: int | None) -> None:
    """``ROLLOUT_SPECULATIVE=group``: each engine's output rank keeps a drafting corpus in host memory (the other TP
    ranks keep none: recipe/drafting/vllm_proposer.py), bounded per engine by ``ROLLOUT_SPECULATIVE_CORPUS_GIB``
    (running texts are never evicted) and by the finished texts it keeps (``ROLLOUT_SPECULATIVE_SUFFIX_CACHED``), each
    text up to a prompt and a response long at the measured bytes per token. The worst case for one node's engines
    is stated with the history it holds and the memory it was checked against: the rollout nodes' (``node_memory``
    is the launcher's: used only where the launcher is the rollout node, recipe/preflight/nodes.py); refused above
    a quarter of it."""
    from ..core.routing_cost import WARN_SHARE_OF_NODE_MEMORY, fmt_bytes
    from ..drafting.bounds import CORPUS_GIB, DEFAULT_CORPUS_GIB, RAY_ENV_KEY
    from ..rollout_spec import GROUP_PROPOSER, KEY
    from .nodes import rollout_node_memory

    spec = select(cfg, KEY)
    if not isinstance(spec, Mapping) or spec.get("model") != GROUP_PROPOSER:
        return
    r = lambda k: select(cfg, f"{ARR}.rollout.{k}")  # noqa: E731
    kept, seqs = spec.get("suffix_decoding_max_cached_requests", 0), r("max_num_seqs")
    gib = float(select(cfg, RAY_ENV_KEY, DEFAULT_CORPUS_GIB))
    text = (select(cfg, "data.max_prompt_length") + select(cfg, "data.max_response_length")) * GROUP_BYTES_PER_TOKEN
    running = seqs * text
    per_engine = min((kept + seqs) * text, max(int(gib * 2**30), running))
    binding = "ROLLOUT_SPECULATIVE_SUFFIX_CACHED" if (kept + seqs) * text <= gib * 2**30 else CORPUS_GIB
    engine_gpus = r("tensor_model_parallel_size") * (r("pipeline_model_parallel_size") or 1)
    engines = max(1, select(cfg, "trainer.n_gpus_per_node") // engine_gpus)
    per_node = per_engine * engines
    texts_per_step = (select(cfg, "data.train_batch_size") * r("n")
                      / max(1, engines * (select(cfg, "trainer.nnodes") or 1)))
    history = min(kept, max(0, per_engine - running) // text)
    memory, where = rollout_node_memory(node_memory)
    what = (f"ROLLOUT_SPECULATIVE=group keeps up to {fmt_bytes(per_node)} of drafting corpus per node ({engines} "
            f"engines x {fmt_bytes(per_engine)}, one corpus per engine on its output rank: {CORPUS_GIB}={gib:g} "
            f"GiB per engine, or (ROLLOUT_SPECULATIVE_SUFFIX_CACHED + ROLLOUT_MAX_NUM_SEQS) x (MAX_PROMPT_LENGTH + "
            f"MAX_RESPONSE_LENGTH) x {GROUP_BYTES_PER_TOKEN} B per token (the measured worst case after eviction, "
            f"bench/group_corpus_bytes.py) where smaller, never less than the running texts' {fmt_bytes(running)}: "
            f"{binding} binds); its history holds ~{history / texts_per_step:.0f} steps of an engine's texts at "
            f"full length (more where responses end sooner); checked against {where}"
            f"{f' ({fmt_bytes(memory)})' if memory else ''}; start-up: its numba kernels compile once per node "
            f"(~{GROUP_KERNELS_COMPILE_S:g} CPU-s, numba's cache: NUMBA_CACHE_DIR, else recipe/drafting/__pycache__) "
            f"and load in ~{GROUP_KERNELS_LOAD_S:g} CPU-s per engine")
    if memory and per_node > WARN_SHARE_OF_NODE_MEMORY * memory:
        errors.append(f"{what}: more than {WARN_SHARE_OF_NODE_MEMORY:.0%} of this node's {fmt_bytes(memory)}: "
                      f"lower {CORPUS_GIB} (bytes per engine) or lower ROLLOUT_SPECULATIVE_SUFFIX_CACHED (texts kept "
                      f"per engine), whichever binds ({binding} here; the prompts' history shrinks)")
    else:
        notes.append(what)
