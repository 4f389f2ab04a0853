"""Contract tests: every verl 0.9.1 hook the recipe uses, pinned. A failure names what to re-check on upgrade."""
import importlib.metadata
import inspect

import pytest

from recipe.adapter.contract import (
    HookContractError,
    check_module_source,
    check_order,
    check_params,
    check_source,
    resolve,
)

BASE = "verl.trainer.ppo.v1.trainer_base:PPOTrainer"
SYNC = "verl.trainer.ppo.v1.trainer_sync:PPOTrainerSync"
TOOL_LOOP = "verl.experimental.agent_loop.tool_agent_loop:ToolAgentLoop"

PARAMS = [
    # trainer hooks overridden by recipe/adapter/trainer.py
    (f"{BASE}._init_dataloader", ["self"], "LengthAwareTrainer._init_dataloader (rebuilds the train dataloader)"),
    (f"{BASE}.step", ["self", "metrics", "timing_raw"], "LengthAwareTrainer.step"),
    (f"{BASE}._next_train_batch", ["self", "num_prompts"], "LengthAwareTrainer._next_train_batch (cap injection)"),
    (f"{BASE}.__init__", ["self", "config"], "LengthAwareTrainer.__init__"),
    (f"{BASE}._build_replay_buffer", ["self"], "LengthAwareTrainer._build_replay_buffer (poll interval)"),
    (f"{BASE}._compute_metrics", ["self", "batch", "metrics", "timing_raw", "global_steps", "epoch"],
     "LengthAwareTrainer._compute_metrics (progress line)"),
    (f"{BASE}._compute_old_log_prob", ["self", "batch", "metrics"],
     "LengthAwareTrainer._compute_old_log_prob (rollout/mismatch/* after verl writes old_log_probs)"),
    (f"{SYNC}.on_init_end", ["self"], "PPOTrainerSync hooks used by the trainer subclass"),
    (f"{SYNC}.on_sample_end", ["self"], "over-sample abort before replicas sleep"),
    (f"{BASE}.on_sample_begin", ["self"], "the tail cut's watch starts with the step's sampling"),
    (f"{SYNC}.on_step_end", ["self"], "over-sample resume after weights update"),
    # entry point
    ("verl.trainer.main_ppo:run_ppo", ["config", "task_runner_class"], "recipe/main.py"),
    ("verl.trainer.main_ppo:TaskRunnerV1.__ray_actor_class__.run", ["self", "config"], "recipe/adapter/task_runner.py"),
    ("verl.utils.config:validate_config", ["config", "use_reference_policy", "use_critic"], "recipe/main.py"),
    # dataset
    ("verl.utils.dataset.rl_dataset:RLHFDataset.__init__",
     ["self", "data_files", "tokenizer", "config", "processor", "max_samples"], "recipe/adapter/dataset.py"),
    ("verl.utils.dataset.rl_dataset:RLHFDataset.__getitem__", ["self", "item"], "recipe/adapter/dataset.py"),
    ("verl.utils.dataset.rl_dataset:RLHFDataset._read_files_and_tokenize", ["self"], "recipe/adapter/dataset.py"),
    ("verl.utils.dataset.rl_dataset:collate_fn", ["data_list"], "the rebuilt train dataloader"),
    # agent loop
    ("verl.experimental.agent_loop.single_turn_agent_loop:SingleTurnAgentLoop.run",
     ["self", "sampling_params", "priority", "**kwargs"], "recipe/adapter/agent_loop.py"),
    # multi-turn: recipe/adapter/tool_agent_loop.py overrides these five
    (f"{TOOL_LOOP}.run", ["self", "sampling_params", "priority", "**kwargs"], "CappedToolAgentLoop.run"),
    (f"{TOOL_LOOP}._handle_pending_state", ["self", "agent_data", "sampling_params"],
     "CappedToolAgentLoop._handle_pending_state (a resumed trajectory's state rebuilt after the prompt)"),
    (f"{TOOL_LOOP}._handle_generating_state", ["self", "agent_data", "sampling_params", "ignore_termination"],
     "CappedToolAgentLoop._handle_generating_state (per-turn max_tokens and seed, aborted turns)"),
    (f"{TOOL_LOOP}._handle_processing_tools_state", ["self", "agent_data"],
     "CappedToolAgentLoop._handle_processing_tools_state (tools cancelled by the rollout gate)"),
    (f"{TOOL_LOOP}._call_tool", ["self", "tool_call", "tools_kwargs", "agent_data"],
     "CappedToolAgentLoop._call_tool (replies kept by call index for a resumed stage)"),
    ("verl.tools.tool_registry:load_all_tools", ["tool_config_path", "function_tool_path"],
     "recipe/preflight/tools.py loads the tool config as the workers do"),
    # abort / resume for over-sampling
    ("verl.checkpoint_engine.base:CheckpointEngineManager.abort_replicas", ["self", "reject_request"],
     "the over-sample abort path"),
    ("verl.checkpoint_engine.base:CheckpointEngineManager.resume_generation_replicas", ["self"],
     "the over-sample resume path"),
    # TransferQueue reads in step()
    ("transfer_queue:kv_batch_get", ["keys", "partition_id", "select_fields"], "LengthAwareTrainer.observe_batch"),
]


@pytest.mark.parametrize("path,params,recheck", PARAMS, ids=[p[0].split(":")[1] for p in PARAMS])
def test_hook_signature(path, params, recheck):
    check_params(path, params, recheck)


def test_verl_version_is_the_pinned_one():
    assert importlib.metadata.version("verl") == "0.9.1", "tests/contract pins verl 0.9.1: re-run them all on upgrade"


def test_sync_trainer_is_registered_and_selected_by_mode():
    from verl.trainer.ppo.v1 import trainer_base
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    assert trainer_base.TRAINER_REGISTRY.get("sync") is PPOTrainerSync, "recipe/adapter/task_runner.py maps 'sync'"
    check_source("verl.trainer.main_ppo:TaskRunnerV1.__ray_actor_class__.run",
                 ["get_trainer_cls(config.trainer.v1.trainer_mode)"], "recipe/adapter/task_runner.py")
    check_source("verl.trainer.ppo.v1.trainer_base:get_trainer_cls", ["TRAINER_REGISTRY[name]"],
                 "recipe/adapter/task_runner.py")


def test_dataloader_is_built_before_checkpoint_load():
    check_order(f"{BASE}._setup", "self._init_dataloader()", "self._load_checkpoint()",
                "sampler state restore into the rebuilt dataloader")
    check_source(f"{BASE}._load_checkpoint", ["self.train_dataloader.load_state_dict(", "data.pt"],
                 "sampler state restore from data.pt")
    check_source(f"{BASE}._save_checkpoint", ["torch.save(self.train_dataloader.state_dict()"],
                 "sampler state saved with each checkpoint")


def test_old_log_probs_are_in_transfer_queue_when_compute_old_log_prob_returns():
    check_order(f"{BASE}._compute_old_log_prob", 'data["old_log_probs"] = ', "return batch",
                "LengthAwareTrainer.mismatch reads old_log_probs and rollout_log_probs after verl's method returns")
    check_source(f"{BASE}._compute_old_log_prob", ['fields.extend(["responses", "rollout_log_probs"])'],
                 "the rollout's log-probs are records' rollout_log_probs with calculate_log_probs")


def test_step_runs_before_the_checkpoint_save():
    check_order(f"{BASE}.fit", "batch = self.step(", "self._save_checkpoint()",
                "estimate updates in step() must be saved with the same step")
    check_order(f"{BASE}.fit", "self._compute_metrics(batch", "tq.kv_clear(keys=batch.keys",
                "observe_batch reads TransferQueue before fit clears it")


def test_replay_buffer_polls_by_an_attribute_the_trainer_sets():
    check_source("verl.trainer.ppo.v1.replay_buffer:ReplayBuffer.__init__", ["self.poll_interval = poll_interval"],
                 "LengthAwareTrainer._build_replay_buffer sets poll_interval after construction")
    check_source("verl.trainer.ppo.v1.replay_buffer:ReplayBuffer._wait_for_next_poll",
                 ["time.sleep(self.poll_interval)"], "recipe.replay_buffer.poll_interval_s")
    check_order(f"{BASE}.fit", "self._compute_metrics(batch, metrics", "self.logger.log(data=metrics",
                "the progress line prints the metrics verl logs")


def test_sampling_is_bracketed_by_the_hooks_the_tail_cut_uses():
    check_order(f"{BASE}._step_once", "self.on_sample_begin()", "self.replay_buffer.sample(",
                "the tail cut watches the step from on_sample_begin")
    check_order(f"{BASE}._step_once", "self.replay_buffer.sample(", "self.on_sample_end()",
                "the tail cut's watch ends in on_sample_end, before the replicas sleep")
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    assert "on_sample_begin" not in PPOTrainerSync.__dict__, "PPOTrainerSync now overrides on_sample_begin: re-check"


def test_train_batches_flow_through_next_train_batch():
    check_source(f"{BASE}._add_batch_to_generate", ["self._next_train_batch()"], "cap injection")
    check_source(f"{BASE}._add_prompts_to_generate", ["self._next_train_batch(num_prompts)"], "cap injection")
    check_source(f"{BASE}._fetch_one_gen_batch", ["next(self.train_dataloader_it)", "iter(self.train_dataloader)",
                                                  "if self.train_dataloader_it is None:"],
                 "the sampler's epoch handling; OverSampleDriver.launch creates the iterator first after a resume")


def test_validation_rows_never_pass_through_next_train_batch():
    """Validation batches are built from the val dataloader directly, so they carry no ``rollout_step`` (nor cap or
    seed): the rollout gate never cuts a validation trajectory, even one that starts while a worker's view of the
    gate still shows the previous step's close (verl validates right after ``on_step_end`` reopens it)."""
    check_source(f"{BASE}._validate", ["for batch_dict in self.val_dataloader:", "tu.get_tensordict(batch_dict)",
                                       "self.agent_loop_manager.generate_sequences(batch)"],
                 "recipe/adapter/fields.py ROLLOUT_STEP (validation rows must carry no step)")
    assert "_next_train_batch" not in inspect.getsource(resolve(f"{BASE}._validate")), (
        "verl's _validate now fetches through _next_train_batch: validation rows would carry a rollout_step; re-check "
        "recipe/adapter/fields.py ROLLOUT_STEP")


def test_row_fields_reach_agent_loop_and_transfer_queue():
    worker = "verl.trainer.ppo.v1.agent_loop_tq:AgentLoopWorkerTQ.__ray_actor_class__"
    check_source(f"{worker}.generate_sequences", ["prompt[k] = v[i]", "NonTensorStack"],
                 "per-row cap/prediction fields passed as agent-loop kwargs")
    check_source(f"{worker}._agent_loop_postprocess", ["field.update(kwargs)"],
                 "dataset_item_idx/cap/prediction stored with each trajectory")
    check_source(f"{worker}._run_prompt", ["dict(sampling_params)"], "sampling_params shared by a prompt's n runs")


def test_agent_loop_registration_through_config_path():
    check_source("verl.experimental.agent_loop.agent_loop:AgentLoopWorker.__init__",
                 ["agent_loop_config_path", "_agent_loop_registry[agent_loop_config.name] = agent_loop_config"],
                 "configs/agent_loops.yaml registration")
    check_source("verl.experimental.agent_loop.agent_loop:AgentLoopWorker._run_agent_loop",
                 ["hydra.utils.instantiate", "await agent_loop.run(sampling_params, **kwargs)"],
                 "CappedSingleTurnAgentLoop instantiation")
    from verl.workers.config import AgentLoopConfig

    fields = AgentLoopConfig.__dataclass_fields__
    assert "agent_loop_config_path" in fields and "default_agent_loop" in fields


def test_row_priority_reaches_vllms_request_on_the_v1_path():
    """recipe.adapter.trainer.row_priorities -> batch field ``priority`` -> AgentLoopWorkerTQ passes row fields as
    kwargs -> SingleTurnAgentLoop.run(priority) -> LLMServerClient.generate -> vLLMHttpServer.generate ->
    AsyncLLM.generate(priority), with vLLM's scheduler in priority mode from rollout.scheduling_policy."""
    check_source("verl.experimental.agent_loop.single_turn_agent_loop:SingleTurnAgentLoop.run",
                 ["priority = int(priority)", "priority=priority"], "CappedSingleTurnAgentLoop forwards **kwargs")
    check_source("verl.workers.rollout.llm_server:LLMServerClient.generate",
                 ['priority = kwargs.pop("priority", 0)', '{"priority": priority} if priority != 0'],
                 "a priority of 0 is not sent: the recipe's priorities are -(predicted length), never 0 for a row "
                 "with a prediction")
    check_module_source("verl.workers.rollout.vllm_rollout.vllm_async_server",
                        ["priority: int = 0,", "priority=priority,",
                         '"scheduling_policy": self.config.scheduling_policy'],
                        "vLLMHttpServer hands the priority and the scheduling policy to vLLM")
    from verl.workers.config.rollout import RolloutConfig

    assert "scheduling_policy" in RolloutConfig.__dataclass_fields__


def test_vllm_server_honours_per_request_max_tokens():
    check_module_source("verl.workers.rollout.vllm_rollout.vllm_async_server",
                        ['sampling_params.pop("max_tokens")', "SamplingParams(max_tokens=max_tokens"],
                        "the cap reaches vLLM as max_tokens")


def test_vllm_server_abort_api():
    check_module_source("verl.workers.rollout.vllm_rollout.vllm_async_server",
                        ["async def abort_all_requests(self, reset_prefix_cache: bool = True, reject_request: bool",
                         "async def resume_generation(self)"], "over-sample abort/resume")
    from verl.workers.rollout.replica import TokenOutput

    assert {"token_ids", "log_probs", "stop_reason", "extra_fields"} <= set(TokenOutput.model_fields)


def test_tool_agent_loop_behaviour_the_capped_loop_relies_on():
    """What CappedToolAgentLoop's overrides assume of verl's ToolAgentLoop (recipe/adapter/tool_agent_loop.py)."""
    recheck = "recipe/adapter/tool_agent_loop.py"
    # the budget: verl checks self.response_length after each turn and each tool reply, and cuts the output with it
    check_source(f"{TOOL_LOOP}._handle_generating_state",
                 ["len(agent_data.response_mask) >= self.response_length", "self.server_manager.generate(",
                  "self.tool_parser.extract_tool_calls(", "agent_data.assistant_turns += 1"], recheck)
    check_source(f"{TOOL_LOOP}._handle_processing_tools_state",
                 ["if len(response_mask) >= self.response_length:", "agent_data.tool_calls[: self.max_parallel_calls]",
                  "return AgentState.GENERATING"], recheck)
    check_source(f"{TOOL_LOOP}.run", ["response_ids[: self.response_length]",
                                      "agent_data.prompt_ids[-len(agent_data.response_mask) :]"], recheck)
    # verl's loop does not forward the priority itself (else the client would get it twice)
    check_source(f"{TOOL_LOOP}._handle_generating_state", ["sampling_params=sampling_params,"], recheck)
    from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop

    assert "priority=" not in inspect.getsource(ToolAgentLoop._handle_generating_state)
    # the client passes a per-request priority on to the vLLM server
    check_source("verl.workers.rollout.llm_server:LLMServerClient.generate",
                 ['priority = kwargs.pop("priority", 0)'], recheck)
    # a tool exception becomes an error reply, but cancellation (BaseException) propagates to the gate's race
    check_source(f"{TOOL_LOOP}._call_tool", ["except Exception as e:"], recheck)


def test_tool_agent_loop_state_a_resume_rebuilds():
    """Over-sample ``continue`` on multi-turn (CappedToolAgentLoop._restore / _cut, recipe/adapter/partial.py): the
    AgentData fields a resume sets, where verl's loop starts and what it builds the output from."""
    recheck = "CappedToolAgentLoop._restore / _boundary / _cut (recipe/adapter/tool_agent_loop.py)"
    check_source("verl.experimental.agent_loop.tool_agent_loop:AgentData.__init__",
                 ["self.messages = messages", "self.metrics = metrics", "self.prompt_ids: list[int] = []",
                  "self.response_mask: list[int] = []", "self.response_logprobs: list[float] = []",
                  "self.turn_scores: list[float] = []", "self.tool_rewards: list[float] = []", "self.user_turns = 0",
                  "self.assistant_turns = 0", "self.tool_calls: list[FunctionCall] = []",
                  "self.extra_fields: dict[str, Any] = {}"], recheck)
    # the machine starts in PENDING, which only builds the prompt: the restored state is entered from there
    check_order(f"{TOOL_LOOP}.run", "state = AgentState.PENDING", "await self._handle_pending_state(", recheck)
    check_source(f"{TOOL_LOOP}._handle_pending_state", ["agent_data.prompt_ids = prompt_ids",
                                                        "return AgentState.GENERATING"], recheck)
    check_source(f"{TOOL_LOOP}.run", ["num_turns=agent_data.user_turns + agent_data.assistant_turns + 1",
                                      "metrics=agent_data.metrics", "extra_fields=agent_data.extra_fields",
                                      '"turn_scores": agent_data.turn_scores, "tool_rewards": agent_data.tool_rewards'],
                 recheck)
    # a continued turn is merged and parsed whole (ContinueFrom returns stored + new tokens as one turn); restored
    # version fields keep the first turn's versions, later turns only raise max_global_steps
    check_source(f"{TOOL_LOOP}._handle_generating_state",
                 ["agent_data.response_ids = output.token_ids", "if not agent_data.extra_fields:",
                  'agent_data.extra_fields["max_global_steps"] = max_global_steps',
                  "assistant_logprobs=output.log_probs if output.log_probs else None"], recheck)
    # a cancelled tool stage leaves the trajectory as it found it: verl changes it only after every call replied
    check_order(f"{TOOL_LOOP}._handle_processing_tools_state", "responses = await asyncio.gather(*tasks)",
                "agent_data.messages.extend(add_messages)", recheck)
    check_source(f"{TOOL_LOOP}._handle_processing_tools_state", ["previous_messages = list(agent_data.messages)"],
                 recheck)
    # each call is one of agent_data.tool_calls, passed as itself (its index names its stored reply), and the replies
    # are matched to the calls by position
    check_source(f"{TOOL_LOOP}._handle_processing_tools_state",
                 ["for tool_call in agent_data.tool_calls[: self.max_parallel_calls]:",
                  "tasks.append(self._call_tool(tool_call, agent_data.tools_kwargs, agent_data))",
                  "tool_call = agent_data.tool_calls[tool_index]"], recheck)
    from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
    from verl.experimental.agent_loop.tool_parser import FunctionCall

    assert {"name", "arguments", "tool_call_id"} == set(FunctionCall.model_fields), recheck
    assert {"prompt_ids", "response_ids", "response_mask", "response_logprobs", "multi_modal_data", "num_turns",
            "metrics", "extra_fields"} <= set(AgentLoopOutput.model_fields), recheck
    # what the stored record holds (recipe.adapter.partial.fetch_partial reads these fields back)
    check_source("verl.experimental.agent_loop.agent_loop:AgentLoopOutput.as_dict",
                 ['output["prompts"]', 'output["responses"]', 'output["response_mask"]',
                  'output["rollout_log_probs"]'], "recipe.adapter.partial.fetch_partial")
    check_source("verl.trainer.ppo.v1.agent_loop_tq:AgentLoopWorkerTQ.__ray_actor_class__._agent_loop_postprocess",
                 ["field = output.as_dict()", 'keys.append(f"{uid}_{session_id}_{i}")'],
                 "recipe.adapter.partial.fetch_partial (PartialRef.key)")


def test_vllm_server_rejects_late_requests_when_asked():
    """The tail cut aborts with reject_request=True: a turn that arrives behind the closed gate gets an empty aborted
    reply at once instead of parking until the resume after the step (a multi-turn deadlock)."""
    check_module_source("verl.workers.rollout.vllm_rollout.vllm_async_server",
                        ["if self._rejecting:", 'stop_reason="aborted"', "self._rejecting = reject_request",
                         "await self._resume_event.wait()"], "recipe/adapter/tail_cut.py")


def test_custom_dataset_class_hook():
    check_source("verl.utils.dataset.rl_dataset:get_dataset_class", ["custom_cls", "load_extern_object"],
                 "data.custom_cls plugging of LengthAwareRLHFDataset")
    check_source("verl.utils.dataset.rl_dataset:RLHFDataset.resume_dataset_state", ["_read_files_and_tokenize()"],
                 "train-set truncation re-applied on resume")


def test_torchdata_sampler_state_protocol():
    from torchdata.stateful_dataloader.sampler import _BatchSamplerIterator
    from torchdata.stateful_dataloader.stateful import Stateful

    from recipe.adapter.sampler import LengthAwareEpochSampler

    assert issubclass(LengthAwareEpochSampler, Stateful)
    check_source("torchdata.stateful_dataloader.sampler:_BatchSamplerIterator.state_dict",
                 ["self.sampler.state_dict()"], "sampler state in data.pt")
    check_order("torchdata.stateful_dataloader.sampler:_BatchSamplerIterator.load_state_dict",
                "self.sampler.load_state_dict(", "self.sampler_iter = iter(self.sampler)",
                "resume: load_state_dict before iter(), no fast-forward for a stateful sampler")
    assert _BatchSamplerIterator is not None


def test_file_logger_path_and_truncation():
    check_source("verl.utils.tracking:FileLogger", ["VERL_FILE_LOGGER_PATH"], "scripts/train_grpo.sh log paths")


# -- the checker itself must fail loudly --------------------------------------------------------------------------
def test_checker_fails_when_a_hook_is_renamed(monkeypatch):
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    monkeypatch.setattr(PPOTrainer, "_next_train_batch_v2", PPOTrainer._next_train_batch, raising=False)
    monkeypatch.delattr(PPOTrainer, "_next_train_batch")
    with pytest.raises(HookContractError, match=r"_next_train_batch is gone.*"):
        check_params(f"{BASE}._next_train_batch", ["self", "num_prompts"], "cap injection")


def test_checker_fails_when_a_signature_changes(monkeypatch):
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    def step(self, metrics, timing_raw, extra):  # a hypothetical new signature
        return None

    monkeypatch.setattr(PPOTrainer, "step", step)
    with pytest.raises(HookContractError, match=r"changed: parameters .*'extra'.*Re-check LengthAwareTrainer.step"):
        check_params(f"{BASE}.step", ["self", "metrics", "timing_raw"], "LengthAwareTrainer.step")


def test_checker_fails_when_a_behaviour_disappears(monkeypatch):
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    def _add_batch_to_generate(self):
        return None

    monkeypatch.setattr(PPOTrainer, "_add_batch_to_generate", _add_batch_to_generate)
    with pytest.raises(HookContractError, match="no longer contains"):
        check_source(f"{BASE}._add_batch_to_generate", ["self._next_train_batch()"], "cap injection")


def test_resolve_reports_missing_module_attribute():
    with pytest.raises(HookContractError, match="is gone"):
        resolve("verl.trainer.ppo.v1.trainer_base:NoSuchTrainer")


def test_recipe_package_is_not_shadowed_by_transfer_queue():
    """TransferQueue installs a namespace dir named ``recipe``; the editable install must win from any cwd."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", "import recipe; print(recipe.__file__)"], cwd="/",
                         capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith("recipe/__init__.py"), out


def test_rollout_engine_kwargs_reach_vllm_verbatim():
    """ROLLOUT_SPECULATIVE sets engine_kwargs.vllm.speculative_config; verl passes engine_kwargs.vllm to vLLM's
    engine arguments unchanged, a dict as JSON on vLLM's command line (recipe/rollout_spec.py)."""
    check_module_source("verl.workers.rollout.vllm_rollout.vllm_async_server",
                        ['engine_kwargs = self.config.get("engine_kwargs", {}).get(self._get_engine_kwargs_key(), {})',
                         "**engine_kwargs,", "build_cli_args_from_config(args)"],
                        "recipe/rollout_spec.py hydra_override")
    check_source("verl.workers.rollout.vllm_rollout.utils:build_cli_args_from_config",
                 ["json.dumps(v) if isinstance(v, dict) else str(v)"], "the speculative_config dict becomes JSON")


def test_delta_sharded_weight_transfer_refuses_speculation():
    check_module_source("verl.workers.rollout.vllm_rollout.delta_weight_transfer",
                        ['getattr(self.vllm_config, "speculative_config", None) is not None',
                         "does not support speculative decoding"],
                        "recipe/rollout_spec.py problems names ROLLOUT_SPECULATIVE with delta_sharded")
    from verl.workers.config.rollout import RolloutConfig

    assert "checkpoint_engine" in RolloutConfig.__dataclass_fields__


def test_rollout_logprobs_are_recomputed_unless_bypass_mode():
    """What speculation must keep right: verl recomputes old_log_probs with the actor and uses the rollout's for its
    diff metrics and rollout correction, or as old_log_probs in bypass mode; vLLM returns them in processed mode."""
    check_source(f"{BASE}._compute_old_log_prob",
                 ['bypass_recomputing_logprobs = rollout_corr_config and rollout_corr_config.get("bypass_mode", False)',
                  'data["old_log_probs"] = data.pop("rollout_log_probs")',
                  "self.actor_rollout_wg.compute_log_prob(batch)"],
                 "recipe/rollout_spec.py docstring; tests/spec/test_spec_engine.py checks processed logprobs")
    from verl.workers.config.rollout import RolloutConfig

    assert RolloutConfig.__dataclass_fields__["logprobs_mode"].default == "processed_logprobs"


def test_routing_replay_behaviour_the_recipes_loops_rely_on():
    """What recipe/adapter/routes.py assumes of verl and vLLM for R3: the server returns the routes of a request's
    final output (an aborted one too) only with the rollout key; verl's loops keep the last turn's routes sliced
    to prompt + response; TransferQueue refuses a batch missing the field in some samples; Megatron's replay mask
    skips a sequence without trained tokens; a re-prefill can travel as its trajectory's requests do."""
    recheck = "recipe/adapter/routes.py"
    check_module_source("verl.workers.rollout.vllm_rollout.vllm_async_server",
                        ["if self.config.enable_rollout_routing_replay:",
                         "routed_experts = final_res.outputs[0].routed_experts"], recheck)
    check_module_source("vllm.v1.engine.output_processor",
                        ["if finished and self.routed_experts_chunks:", "finish_reason=FinishReason.ABORT,"], recheck)
    check_source(f"{TOOL_LOOP}._handle_generating_state",
                 ["if output.routed_experts is not None:", "agent_data.routed_experts = output.routed_experts"],
                 recheck)
    check_source("verl.experimental.agent_loop.single_turn_agent_loop:SingleTurnAgentLoop.run",
                 ["output.routed_experts[: len(prompt_ids) + self.response_length]"], recheck)
    check_source("verl.trainer.ppo.metric_utils:get_metric_data_with_optional_routed_experts",
                 ['if "routed_experts" not in str(exc):'], recheck)
    check_source("verl.utils.megatron.router_replay_utils:build_r3_replay_mask",
                 ["response_lens = response_mask.sum(dim=-1)",
                  "torch.where(response_lens > 0, total_lens - 1, torch.zeros_like(total_lens))"], recheck)
    # a routes array of no rows (a trajectory that trains nothing) is padded to the sequence, never replayed
    check_source("verl.experimental.agent_loop.agent_loop:AgentLoopOutput.as_dict",
                 ["aligned = routed_experts.new_zeros((total_length, *routed_experts.shape[1:]))"], recheck)
    # a re-prefill reuses the trajectory's request id and the row's priority: verl's loops send them, and the
    # client hands the id to the router (sticky routing, group affinity) before the server
    check_source("verl.experimental.agent_loop.single_turn_agent_loop:SingleTurnAgentLoop.run",
                 ["request_id=request_id,", "priority=priority,"], recheck)
    check_source(f"{TOOL_LOOP}._handle_generating_state", ["request_id=agent_data.request_id,"], recheck)
    check_source("verl.workers.rollout.llm_server:LLMServerClient.generate",
                 ["server_id, server = await self._acquire_server(", "request_id,", "prompt_ids=prompt_ids,"], recheck)
