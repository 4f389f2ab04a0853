"""vLLM's ``custom_class`` speculative proposer over the recipe's group corpus (``ROLLOUT_SPECULATIVE=group``).

vLLM 0.28 loads ``speculative_config.model`` (``recipe.drafting.vllm_proposer.GroupProposer``) for
``method="custom_class"`` in each model runner (``v1/spec_decode/custom_class_proposer.py``) and calls its
``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=...)`` after every sampled step
(``GPUModelRunner.propose_draft_token_ids``; vLLM CPU's runner is a subclass). That call names the batch's rows but not
their requests, and the corpus needs both (which prompt a row belongs to, when a request has left), so constructing
the proposer wraps ``propose_draft_token_ids`` once to hand the proposer the runner's ``input_batch`` (request ids,
prompt lengths) before each call; ``tests/spec/test_vllm_spec_contract.py`` pins both signatures.

Settings come from vLLM's own suffix-decoding fields of the speculative config, which mean the same here:
``suffix_decoding_max_tree_depth`` the longest match, ``suffix_decoding_max_cached_requests`` the finished responses
kept; ``num_speculative_tokens`` the most drafted per step. vLLM verifies whatever is proposed with its rejection
sampler: the proposer cannot change what is sampled.
"""
from __future__ import annotations

from recipe.drafting.corpus import GroupCorpus

MARK = "recipe_group_drafter"


class GroupProposer:
    """Drafts for each running request from its prompt's texts in this engine (see ``recipe.drafting.corpus``)."""

    def __init__(self, vllm_config):
        spec = vllm_config.speculative_config
        self.max_model_len = vllm_config.model_config.max_model_len
        self.corpus = GroupCorpus(k=spec.num_speculative_tokens, max_n=spec.suffix_decoding_max_tree_depth,
                                  max_finished=spec.suffix_decoding_max_cached_requests)
        self.batch = None  # the runner's InputBatch, set before each propose (bind_input_batch)
        bind_input_batch()

    def load_model(self, *args, **kwargs) -> None:
        """No model to load (vLLM CPU's runner calls this on every drafter, v1/worker/cpu_model_runner.py)."""

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None) -> list[list[int]]:
        batch = self.batch
        if batch is None:
            raise RuntimeError("recipe.drafting GroupProposer: vLLM's model runner called propose() without going "
                               "through GPUModelRunner.propose_draft_token_ids, which hands it the batch's request "
                               "ids; this vLLM is not the one the recipe pins (vllm==0.28)")
        req_ids = batch.req_ids[:len(sampled_token_ids)]
        for gone in self.corpus.live() - set(req_ids):
            self.corpus.finish(gone)
        drafts: list[list[int]] = []
        for i, (req_id, sampled) in enumerate(zip(req_ids, sampled_token_ids)):
            n = int(num_tokens_no_spec[i])
            self.corpus.observe(req_id, token_ids_cpu[i, :n], int(batch.num_prompt_tokens[i]))
            room = min(self.corpus.k, self.max_model_len - n)
            drafts.append(self.corpus.propose(req_id, room) if sampled and room > 0 else [])
        return drafts


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
