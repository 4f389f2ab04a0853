"""The routing-data model of router replay: bytes per token and per response, what the rollout writes per step and
the trainer reads, and vLLM's buffer per KV-cache slot."""
import pytest

from recipe.core.routing_cost import (describe, fmt_bytes, launched_prompts, routing_cost, trainer_passes,
                                      vllm_buffer_bytes_per_kv_token)

QWEN3_30B = {"layers": 48, "top_k": 8}


def test_qwen3_30b_a3b_at_the_issue_sizes():
    """48 layers x top-8 int16 = 768 B/token; a 16k-token response 12.6 MB; 512 x 16 of them 103 GB."""
    cost = routing_cost("R3", **QWEN3_30B, batch=512, n=16, prompt_length=1, response_length=16384 - 1)
    assert cost.bytes_per_token == 768
    assert cost.per_response == 16384 * 768 == 12_582_912
    assert cost.per_step == 512 * 16 * 12_582_912  # 103 GB
    assert cost.launched_responses == cost.trained_responses == 8192


def test_the_prompt_is_carried_too():
    """verl aligns the routes to prompt + response rows (AgentLoopOutput.as_dict)."""
    with_prompt = routing_cost("R3", **QWEN3_30B, batch=1, n=1, prompt_length=1024, response_length=16384)
    assert with_prompt.per_response == (1024 + 16384) * 768


def test_over_sampling_launches_more_and_the_trainer_reads_the_trained_only():
    """Aborted groups' routes are written but never read; ``continue`` keeps none of them across the step (the
    over-sampler empties the kept records' routes)."""
    cost = routing_cost("R3", **QWEN3_30B, batch=32, n=16, prompt_length=1024, response_length=16384,
                        over_sample_ratio=0.25)
    per_response = 17408 * 768
    assert launched_prompts(32, 0.25) == 40
    assert cost.per_step == 40 * 16 * per_response and cost.launched_responses == 640
    assert cost.trained_responses == 512 and cost.trainer_reads == 2 * 512 * per_response  # old log-probs, update


def test_the_trainer_reads_once_per_pass_and_model_parallel_rank():
    """Old log-probs (not in bypass mode), the reference's pass (it fetches the batch, routes included, though it does
    not replay them) and the update; each of TP x PP x CP ranks of a data-parallel group fetches the group's shard."""
    base = dict(**QWEN3_30B, batch=512, n=16, prompt_length=1024, response_length=16384)
    per_step_trained = 512 * 16 * 17408 * 768
    assert trainer_passes("R3") == ("old log-probs", "update")
    assert trainer_passes("R3", reference=True) == ("old log-probs", "ref", "update")
    assert trainer_passes("R3", bypass_old_log_probs=True) == ("update",)
    with_ref = routing_cost("R3", **base, reference=True, model_parallel=4)
    assert with_ref.trainer_reads == 3 * 4 * per_step_trained  # 1.31 TB
    assert routing_cost("R3", **base, bypass_old_log_probs=True).trainer_reads == per_step_trained
    text = describe(with_ref)
    assert "the trainer reads 1.31 TB per step (8192 responses x 3 passes: old log-probs, ref, update x 4 " \
           "model-parallel ranks); none held across steps" in text


def test_launched_prompts_rounds_up_like_the_controller():
    assert launched_prompts(10, 0.25) == 13  # ceil(12.5)
    assert launched_prompts(8, 0.25) == 10  # exact, no float creep to 11
    assert launched_prompts(7, 0.0) == 7


def test_r2_moves_only_trained_responses_and_reads_them_in_the_update():
    r2 = routing_cost("R2", **QWEN3_30B, batch=32, n=16, prompt_length=1024, response_length=16384,
                      over_sample_ratio=0.25, reference=True)
    assert r2.per_step == 32 * 16 * 17408 * 768 and r2.reads == ("update",)


def test_off_costs_nothing():
    off = routing_cost("off", **QWEN3_30B, batch=512, n=16, prompt_length=1024, response_length=16384)
    assert (off.per_step, off.trainer_reads, off.per_response) == (0, 0, 0)
    assert describe(off).startswith("off")


def test_vllms_buffer_is_uint8_per_kv_slot_up_to_256_experts():
    """vLLM 0.24's RoutedExpertsManager: layers x top-k ids per KV-cache slot, uint8 for <= 256 experts."""
    assert vllm_buffer_bytes_per_kv_token(48, 8, 128) == 384
    assert vllm_buffer_bytes_per_kv_token(48, 8, 256) == 384
    assert vllm_buffer_bytes_per_kv_token(61, 8, 257) == 61 * 8 * 2


@pytest.mark.parametrize("kwargs", [{"layers": 0, "top_k": 8}, {"layers": 48, "top_k": 0}])
def test_a_model_without_routing_is_refused(kwargs):
    with pytest.raises(ValueError, match="layers >= 1 and top_k >= 1"):
        routing_cost("R3", **kwargs, batch=1, n=1, prompt_length=1, response_length=1)


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="one of"):
        routing_cost("R4", **QWEN3_30B, batch=1, n=1, prompt_length=1, response_length=1)


def test_description_names_sizes_and_path():
    cost = routing_cost("R3", **QWEN3_30B, batch=512, n=16, prompt_length=1024, response_length=16384,
                        over_sample_ratio=0.25)
    text = describe(cost)
    assert text.startswith("R3: 768 B/token (int16), up to 13.4 MB per response; 137 GB written per step for 10240 "
                           "responses (vLLM -> agent loops -> TransferQueue); the trainer reads 219 GB per step")
    assert fmt_bytes(12_582_912) == "12.6 MB" and fmt_bytes(103e9) == "103 GB" and fmt_bytes(512) == "512 B"
