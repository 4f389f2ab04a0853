"""What the eagle3 head's keeping and online learning rely on in verl 0.9.1 and vLLM 0.24 (recipe/adapter/
draft_learning.py, engine_rpc.py, recipe/drafting/head_capture.py, head_sync.py, worker_methods.py), pinned. The engine
tests (tests/spec/test_head_capture.py, test_eagle3_head_sync.py) run the vLLM side on the CPU; what only verl's GPU
path shows (the level-2 sleep that drops the head) is pinned here by source."""
import inspect

from recipe.adapter.contract import check_module_source, check_params, check_source

SERVER = "verl.workers.rollout.vllm_rollout.vllm_async_server"
BASE = "verl.trainer.ppo.v1.trainer_base:PPOTrainer"


def test_verl_sleeps_an_eagle3_engine_at_level_2_and_syncs_only_the_policy():
    """Why the head is pushed after every weight sync: level 1 is kept for MTP, LoRA and NPUs only."""
    check_module_source(SERVER, ["def _resolve_sleep_level(self) -> int:", "if mtp_rollout_enabled or "
                                 "self.lora_as_adapter or is_torch_npu_available(check_device=False):",
                                 "await self.engine.sleep(level=self._resolve_sleep_level())"],
                        "recipe/adapter/draft_learning.py: if verl restores drafter weights itself, the push is only "
                        "the online head's")
    check_source("vllm.v1.worker.gpu_worker:Worker.load_model", ['_maybe_get_memory_pool_context(tag="weights")',
                                                                 "self.model_runner.load_model("],
                 "the head is loaded under the target's memory tag, so a level-2 sleep discards it too")
    check_source("vllm.v1.worker.gpu_model_runner:GPUModelRunner.load_model", ["self.drafter.load_model(self.model)"],
                 "the drafter is loaded inside the runner's load_model (same tag)")


def test_the_server_actor_owns_the_engine_and_a_task_on_its_loop():
    check_module_source(SERVER, ["self.engine = engine_client",
                                 "self._server_port, self._server_task = await run_uvicorn("],
                        "recipe/adapter/engine_rpc.py reaches .engine and finds the actor's loop by _server_task")
    check_module_source(SERVER, ["async def collective_rpc(", "await self.engine.collective_rpc("],
                        "engine_rpc.py calls vLLM itself because verl's wrapper drops the result")


def test_workers_take_named_methods_and_pickle_anything_else_again():
    check_source("vllm.v1.executor.multiproc_executor:MultiprocExecutor.collective_rpc",
                 ["if isinstance(method, str):", "send_method = cloudpickle.dumps(method"],
                 "recipe/drafting/worker_methods.py: methods by name (a function or its bytes would not arrive)")
    check_source("vllm.v1.worker.worker_base:WorkerWrapperBase.__getattr__", ["return getattr(self.worker, attr)"],
                 "a method added to WorkerBase is found through the wrapper")
    check_source("vllm.v1.engine.core_client:AsyncMPClient._call_utility_async", ["self.utility_results[call_id]"],
                 "engine_rpc.each_core asks every engine core itself")


def test_the_eagle_drafter_is_handed_what_the_capture_reads():
    check_params("vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer.propose",
                 ["self", "num_speculative_tokens", "target_token_ids", "target_positions", "target_hidden_states",
                  "next_token_ids", "token_indices_to_sample", "common_attn_metadata", "sampling_metadata",
                  "mm_embed_inputs", "num_rejected_tokens_gpu", "slot_mappings"],
                 "recipe/drafting/head_capture.py binds these by name")
    check_source("vllm.v1.worker.gpu_model_runner:GPUModelRunner.propose_draft_token_ids",
                 ["[h[:num_scheduled_tokens] for h in aux_hidden_states], dim=-1",
                  "self.drafter.prepare_inputs_padded(", "num_rejected_tokens_gpu=num_rejected_tokens_gpu,"],
                 "head_capture: aux hidden states concatenated per token; a padded batch's rejected drafts are the "
                 "last num_rejected_tokens_gpu rows of each request's segment")


def test_trainer_checkpoint_hooks_the_head_rides_on():
    check_source(f"{BASE}._save_checkpoint", ['f"global_step_{self.global_steps}"'],
                 "LengthAwareTrainer._save_checkpoint writes global_step_N/draft_head before verl's save")
    check_source(f"{BASE}._load_checkpoint", ['self.global_steps = int(global_step_folder.split("global_step_")[-1])',
                                              "self.config.trainer.resume_from_path"],
                 "LengthAwareTrainer._load_checkpoint reads the head from the folder verl resumed from")
    fit = inspect.getsource(__import__("verl.trainer.ppo.v1.trainer_base", fromlist=["PPOTrainer"]).PPOTrainer.fit)
    assert fit.index("self._save_checkpoint()") < fit.index("self.on_step_end()"), \
        "the head trained in a step is saved with that step's checkpoint, before the next push"
