"""Speculative decoding in the vLLM rollout (``ROLLOUT_SPECULATIVE``): vLLM's config, and its checks.

verl 0.9.1 hands ``actor_rollout_ref.rollout.engine_kwargs.vllm`` to vLLM verbatim (``vllm_async_server.py``: the
dict becomes ``--speculative-config '<json>'``), so the recipe composes one Hydra override,
``+actor_rollout_ref.rollout.engine_kwargs.vllm.speculative_config={...}`` (:func:`hydra_override`), from the
``ROLLOUT_SPECULATIVE*`` variables (:func:`speculative_config`).

What is trained does not change: every method proposes point-mass drafts (``draft_probs=None``), which vLLM's rejection
sampler accepts with probability p(draft) and otherwise replaces by a sample of p with the draft masked out, so every
emitted token is distributed as the target model's (temperature and top-p included), and the logprob returned with it
is computed from the target model's logits at that position (``rejection_sampler.py`` ``_get_logprobs_tensors``).
verl recomputes ``old_log_probs`` with the actor anyway and uses the rollout's only for its ``rollout_probs_diff``
metrics and rollout correction, or as ``old_log_probs`` in ``rollout_correction.bypass_mode``: both stay the target's.
On vLLM CPU this holds only with ``recipe/cpu/vllm_plugin.py``'s expand fix (vLLM #55005).

- ``ngram``: prompt lookup in each request's own context, no dependency. With ``ROLLOUT_SPECULATIVE_MAX_BATCH=N``
  it drafts only while a replica's scheduler step holds at most N requests (vLLM's Dynamic SD,
  ``num_speculative_tokens_per_batch_size=[[1, N, K], [N+1, max_num_seqs, 0]]``): the long tail of a rollout step,
  when a few stragglers leave the GPU idle, speculates; full batches do not pay for verification. Under data
  parallelism vLLM 0.24 applies the schedule per DP rank (each engine core's scheduler to its own batch, with no guard;
  later releases drop it there), so ranks stepping in lockstep verify different numbers of tokens: unmeasured, so
  the preflight refuses it with ``ROLLOUT_DP > 1``. The schedule also moves vLLM's CUDA graphs from full to
  piecewise (``config/vllm.py`` ``_maybe_override_dynamic_sd_cudagraph_mode``).
- ``suffix``: suffix trees over the prompt, the request's own output and up to ``ROLLOUT_SPECULATIVE_SUFFIX_CACHED``
  earlier responses of the same engine (running siblings of a GRPO group feed each other's drafts when they share
  a replica); needs ``arctic-inference``
  (``config/speculative.py`` ``_validate_suffix_decoding``). vLLM's ``SuffixDecodingProposer.propose`` asserts that
  the scheduled K equals ``num_speculative_tokens``, so suffix cannot follow a batch-size schedule: it drafts (up to
  K tokens, as its tree's match allows) at every batch size, full batches included. The fix is vLLM PR #46399.

- ``group``: the recipe's own drafter (``recipe/drafting``, vLLM's ``custom_class`` proposer, no dependency): the
  longest match (up to ``ROLLOUT_SPECULATIVE_SUFFIX_DEPTH`` tokens) of the context's end in the request's own context,
  the running responses of its GRPO group on the same replica (``ROLLOUT_GROUP_AFFINITY=1`` keeps a group on one)
  and up to ``ROLLOUT_SPECULATIVE_SUFFIX_CACHED`` finished responses, the same prompt's earlier epochs among them.
  vLLM calls a custom proposer without the batch-size schedule's K, so it drafts at every batch size.
- ``eagle3``: vLLM's EAGLE-3 proposer with the head at ``DRAFT_MODEL_PATH`` (a published head for the model, or one
  the recipe trains): a small decoder layer over the target's hidden states at three of its layers and the last
  token's embedding, drafting greedily (point-mass drafts, as above). It follows the batch-size schedule (vLLM hands
  the schedule's K to ``propose``). :mod:`recipe.preflight.draft_head` checks the head against the model.

``ngram``, ``suffix`` and ``group`` turn vLLM's async scheduling off for the whole run (``config/vllm.py``), a cost
every step pays; ``eagle3`` keeps it on GPUs (vLLM's CPU platform turns it off for every engine). verl's
``delta_sharded`` weight transfer refuses speculative decoding (``delta_weight_transfer.py``), so the preflight names
that combination instead of letting the rollout workers fail.

Stdlib only: the preflight imports it before anything heavy.
"""
from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from importlib import metadata
from typing import Any

METHODS = ("off", "ngram", "suffix", "group", "eagle3")
GROUP_PROPOSER = "recipe.drafting.vllm_proposer.GroupProposer"  # vLLM imports it by this path
GROUP_ROUTER = "recipe.adapter.router.GroupAffinityLoadBalancer"  # configs/router/group_affinity.yaml's router_class
KEY = "actor_rollout_ref.rollout.engine_kwargs.vllm.speculative_config"
SCHEDULE = "num_speculative_tokens_per_batch_size"
STATS_KEY = "actor_rollout_ref.rollout.disable_log_stats"  # False: vLLM's counters, read for rollout/spec_*
ARCTIC_MODULE, ARCTIC_DIST = "arctic_inference", "arctic-inference"
SUFFIX_FIX = "vLLM PR #46399"
# The variables, for messages (scripts/train_grpo.sh; recipe/preflight/knobs.py)
ENV = {"method": "ROLLOUT_SPECULATIVE", "tokens": "ROLLOUT_SPECULATIVE_TOKENS",
       "max_batch": "ROLLOUT_SPECULATIVE_MAX_BATCH", "ngram_min": "ROLLOUT_SPECULATIVE_NGRAM_MIN",
       "ngram_max": "ROLLOUT_SPECULATIVE_NGRAM_MAX", "suffix_depth": "ROLLOUT_SPECULATIVE_SUFFIX_DEPTH",
       "suffix_cached": "ROLLOUT_SPECULATIVE_SUFFIX_CACHED", "draft": "DRAFT_MODEL_PATH"}


def batch_schedule(tokens: int, max_batch: int, max_num_seqs: int) -> list[list[int]] | None:
    """vLLM's Dynamic SD schedule: ``tokens`` draft tokens while a step holds at most ``max_batch`` requests, none
    above (inclusive ranges; vLLM carries the last entry's K up to any batch size). None for ``max_batch=0``: draft
    at every batch size."""
    if max_batch <= 0:
        return None
    return [[1, max_batch, tokens], [max_batch + 1, max(max_batch + 1, max_num_seqs), 0]]


def speculative_config(v: Mapping[str, Any]) -> dict | None:
    """vLLM's ``speculative_config`` for parsed variables ``v`` (``ROLLOUT_SPECULATIVE*``, ``ROLLOUT_MAX_NUM_SEQS``);
    None when speculation is off."""
    method = v["ROLLOUT_SPECULATIVE"]
    if method == "off":
        return None
    out: dict[str, Any] = {"method": method, "num_speculative_tokens": v["ROLLOUT_SPECULATIVE_TOKENS"]}
    if method == "group":
        out.update(method="custom_class", model=GROUP_PROPOSER)
    if method == "eagle3":
        if v["DRAFT_MODEL_PATH"] in (None, "", "none"):
            from .settings import RecipeConfigError

            raise RecipeConfigError(f"{ENV['method']}=eagle3 needs {ENV['draft']}: export {ENV['draft']}=/path/to/"
                                    "head (an EAGLE-3 head made for MODEL_PATH: config.json and safetensors)")
        out["model"] = v["DRAFT_MODEL_PATH"]
    if method == "ngram":
        out["prompt_lookup_min"] = v["ROLLOUT_SPECULATIVE_NGRAM_MIN"]
        out["prompt_lookup_max"] = v["ROLLOUT_SPECULATIVE_NGRAM_MAX"]
    elif method in ("suffix", "group"):
        out["suffix_decoding_max_tree_depth"] = v["ROLLOUT_SPECULATIVE_SUFFIX_DEPTH"]
        out["suffix_decoding_max_cached_requests"] = v["ROLLOUT_SPECULATIVE_SUFFIX_CACHED"]
    schedule = batch_schedule(v["ROLLOUT_SPECULATIVE_TOKENS"], v["ROLLOUT_SPECULATIVE_MAX_BATCH"],
                              v["ROLLOUT_MAX_NUM_SEQS"])
    if schedule is not None:  # with suffix the preflight refuses it (problems), by name
        out[SCHEDULE] = schedule
    return out


def hydra_value(value: Any) -> str:
    """``value`` (dicts, lists, ints, floats, bools, plain words) in Hydra's override grammar."""
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{hydra_value(x)}" for k, x in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(x) for x in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value)
    if text.startswith("/"):  # an absolute path (DRAFT_MODEL_PATH): quoted
        if "'" in text or "${" in text:
            raise ValueError(f"{text!r}: a path holding ' or ${{ cannot pass through a Hydra override; rename it")
        return f"'{text}'"
    if all(part.isidentifier() for part in text.split(".")) and "." in text:  # a module path: quoted
        return f"'{text}'"
    if not text.replace("_", "").isalnum():
        raise ValueError(f"{text!r} is not a plain word")
    return text


def hydra_override(v: Mapping[str, Any]) -> list[str]:
    """The overrides that turn speculation on (none when ``ROLLOUT_SPECULATIVE=off``): the ``speculative_config``,
    and vLLM's stat logging on (verl's default is off), without which vLLM keeps no acceptance counters for the
    recipe's ``rollout/spec_*`` metrics (``recipe/adapter/spec_metrics.py``)."""
    config = speculative_config(v)
    return [] if config is None else [f"+{KEY}={hydra_value(config)}", f"{STATS_KEY}=False"]


def arctic_inference_version() -> str | None:
    """The installed arctic-inference, ``"?"`` if importable without metadata, None if ``import arctic_inference``
    would fail to find it (what vLLM's ``has_arctic_inference`` checks)."""
    if importlib.util.find_spec(ARCTIC_MODULE) is None:
        return None
    try:
        return metadata.version(ARCTIC_DIST)
    except metadata.PackageNotFoundError:
        return "?"


def vllm_has_batch_schedule() -> bool | None:
    """Whether the installed vLLM's ``SpeculativeConfig`` has the Dynamic SD field (vLLM 0.24 has it); None when
    vLLM is not installed. Read from the source, without importing vLLM."""
    try:
        spec = importlib.util.find_spec("vllm.config.speculative")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    with open(spec.origin, encoding="utf-8") as f:
        return f"{SCHEDULE}:" in f.read()


def arctic_problem(method: str) -> str | None:
    if method != "suffix" or arctic_inference_version() is not None:
        return None
    import sys

    return (f"{ENV['method']}=suffix needs arctic-inference, which is not importable in {sys.executable} (vLLM's "
            "suffix proposer imports arctic_inference.suffix_decoding; vLLM 0.24 asks for "
            "arctic-inference==0.1.1): install it into the launch's Python, or use ROLLOUT_SPECULATIVE=ngram")


def problems(cfg: Mapping) -> list[str]:
    """What vLLM or verl would refuse, or silently not do, about the composed config's speculative decoding (a plain
    nested mapping); each message names the variable to change."""
    from .settings import select

    spec = select(cfg, KEY)
    if spec is None:
        return []
    if not isinstance(spec, Mapping):
        return [f"{KEY} must be a mapping (vLLM's speculative_config), got {spec!r}"]
    out = []
    method = spec.get("method")
    rollout = select(cfg, "actor_rollout_ref.rollout", {}) or {}
    backend = select(rollout, "checkpoint_engine.backend")
    if backend == "delta_sharded":
        out.append(f"{ENV['method']}={method} with actor_rollout_ref.rollout.checkpoint_engine.backend=delta_sharded: "
                   "verl's delta weight transfer refuses speculative decoding (verl/workers/rollout/vllm_rollout/"
                   "delta_weight_transfer.py); use another checkpoint engine backend or ROLLOUT_SPECULATIVE=off")
    mtp = select(rollout, "mtp") or {}
    if mtp.get("enable") and mtp.get("enable_rollout"):
        out.append(f"{ENV['method']}={method} with actor_rollout_ref.rollout.mtp.enable_rollout=True: verl then builds "
                   "its own MTP speculative_config over this one; use one of them")
    arctic = arctic_problem(method)
    if arctic:
        out.append(arctic)
    schedule = spec.get(SCHEDULE)
    if schedule is not None:
        if method == "custom_class":
            out.append(f"{ENV['method']}=group with {ENV['max_batch']} (vLLM's {SCHEDULE}): vLLM calls a custom "
                       "proposer without the schedule's number of draft tokens (v1/worker/gpu_model_runner.py "
                       f"propose_draft_token_ids), so it would draft above the schedule; export {ENV['max_batch']}=0")
        if method == "suffix":
            out.append(f"{ENV['method']}=suffix with {ENV['max_batch']} (vLLM's {SCHEDULE}): vLLM's suffix proposer "
                       "asserts a fixed number of draft tokens (vllm/v1/spec_decode/suffix_decoding.py propose), so "
                       f"a batch-size schedule would crash the engine; export {ENV['max_batch']}=0 (suffix then "
                       f"drafts at every batch size; fixed by {SUFFIX_FIX})")
        if vllm_has_batch_schedule() is False:
            out.append(f"{ENV['max_batch']} needs vLLM's {SCHEDULE} (Dynamic SD), which the installed vLLM's "
                       f"SpeculativeConfig lacks; export {ENV['max_batch']}=0 (draft at every batch size) or use a "
                       "newer vLLM")
        dp = select(rollout, "data_parallel_size") or 1
        if dp > 1:
            out.append(f"{ENV['max_batch']} with ROLLOUT_DP={dp}: vLLM 0.24 applies the batch-size schedule per DP "
                       "rank (each rank's scheduler to its own batch, ranks in lockstep), which nobody has measured; "
                       f"export {ENV['max_batch']}=0 (draft at every batch size) or ROLLOUT_DP=1")
    if spec.get("model") == GROUP_PROPOSER:
        out.extend(group_problems(rollout))
    if method == "ngram":
        lo, hi = spec.get("prompt_lookup_min"), spec.get("prompt_lookup_max")
        if isinstance(lo, int) and isinstance(hi, int) and lo > hi:
            out.append(f"{ENV['ngram_min']}={lo} > {ENV['ngram_max']}={hi}: vLLM needs prompt_lookup_min <= "
                       "prompt_lookup_max")
    return out


def group_problems(rollout: Mapping) -> list[str]:
    """``ROLLOUT_SPECULATIVE=group`` drafts from one engine's corpus: a group's siblings and its prompt's history must
    reach the same engine, so it needs the recipe's group-affinity router and one engine per replica."""
    from .settings import select

    out = []
    path = select(rollout, "router_config_path")
    try:
        routed = bool(path) and GROUP_ROUTER in open(path, encoding="utf-8").read()
    except OSError:
        routed = False
    if not routed:
        out.append(f"{ENV['method']}=group without ROLLOUT_GROUP_AFFINITY=1 (actor_rollout_ref.rollout."
                   f"router_config_path={path!r} does not name {GROUP_ROUTER}): verl's router scatters a group's "
                   "responses and its prompt's later groups over the replicas, and each engine drafts from its own "
                   "corpus only; export ROLLOUT_GROUP_AFFINITY=1 (group's default)")
    dp = select(rollout, "data_parallel_size") or 1
    if dp > 1:
        out.append(f"{ENV['method']}=group with ROLLOUT_DP={dp}: each of a replica's {dp} data-parallel engines keeps "
                   "its own corpus and vLLM's data-parallel balancer spreads a group's requests over them (the "
                   "recipe's router picks the replica, not the engine); export ROLLOUT_DP=1 (more replicas instead)")
    return out
