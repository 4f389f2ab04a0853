"""The verl 0.9.1 and vLLM names the recipe's speculative acceptance metrics rely on (recipe/adapter/spec_metrics.py,
LengthAwareTrainer.prepare_step/step), pinned: an upgrade that renames one fails here with what to re-check."""
from recipe.adapter import spec_metrics
from recipe.adapter.contract import check_module_source, check_order, check_params, check_source

BASE = "verl.trainer.ppo.v1.trainer_base:PPOTrainer"
RECHECK = "recipe/adapter/spec_metrics.py (the rollout/spec_* metrics)"


def test_vllm_counters_and_their_route():
    check_source("vllm.v1.spec_decode.metrics:SpecDecodingProm.__init__",
                 [f'"{name}"' for name in spec_metrics.SPEC_COUNTERS.values()], RECHECK + ": the counter names")
    check_source("vllm.v1.metrics.loggers:PrometheusStatLogger.__init__", ['name="vllm:generation_tokens"'],
                 RECHECK + ": rollout/spec_tokens_per_step")
    check_source("vllm.v1.metrics.stats:IterationStats.update_from_output",
                 ["num_new_generation_tokens = len(output.new_token_ids)"],
                 RECHECK + ": every emitted token (accepted drafts included) counts as generated")
    check_source("vllm.v1.spec_decode.metrics:SpecDecodingStats.observe_draft",
                 ["self.num_drafts += 1", "self.num_draft_tokens += num_draft_tokens",
                  "self.num_accepted_tokens += num_accepted_tokens"], RECHECK + ": what each counter counts")
    # the Prometheus logger is always added once stats are logged (disable_log_stats=False)
    check_source("vllm.v1.metrics.loggers:StatLoggerManager.__init__",
                 ["PrometheusStatLogger(vllm_config, self.engine_indexes)"], RECHECK)
    check_source("vllm.entrypoints.serve.instrumentator.metrics:attach_router", ['"/metrics"'], RECHECK)
    # no per-request acceptance in vLLM 0.28's RequestOutput (verl reads it only for MTP): once there is, the
    # length traces could carry it per response
    from vllm.v1.metrics.stats import RequestStateStats

    assert not any("spec" in f for f in RequestStateStats.__dataclass_fields__), RECHECK + ": per-request stats"


def test_verl_serves_vllms_app_with_stats_from_the_rollout_config():
    check_module_source("verl.workers.rollout.vllm_rollout.vllm_async_server",
                        ['"disable_log_stats": self.config.disable_log_stats', "app = build_app(",
                         "if self.config.mtp is not None and self.config.mtp.enable and self.config.mtp.enable_rollout:",
                         'spec_decode_stats = getattr(final_res.metrics, "request_spec_decode_stats", None)'],
                        RECHECK + " (verl logs acceptance only for MTP; stats from rollout.disable_log_stats)")
    check_source("verl.workers.rollout.llm_server:LLMServerManager",
                 ["self.server_addresses = [server._server_address for server in self.rollout_replicas]"],
                 RECHECK + ": the replicas' HTTP addresses")
    check_source(f"{BASE}._setup", ["self.llm_server_manager: LLMServerManager = LLMServerManager.create("],
                 "LengthAwareTrainer.spec_meter reads self.llm_server_manager.server_addresses")
    # the counters are read in prepare_step (before any of the step's generation) and after step
    check_order(f"{BASE}.step", "prepare_metrics = self.prepare_step()", "self._step_once(", RECHECK)
    check_source(f"{BASE}._step_once", ["self.on_sample_begin()"], RECHECK + ": generation runs inside _step_once")
    # validation: LengthAwareTrainer._validate wraps verl's, adding val-aux/spec_* to the dict verl logs
    check_params(f"{BASE}._validate", ["self"], "LengthAwareTrainer._validate (val-aux/spec_*)")
    check_order(f"{BASE}.fit", "val_metrics = self._validate()", "logger.log(data=val_metrics", RECHECK)
