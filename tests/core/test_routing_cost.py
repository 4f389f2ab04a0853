"""The routing-data model of router replay: bytes per token, per response, per step and across steps."""
import pytest

from recipe.core.routing_cost import describe, fmt_bytes, launched_prompts, routing_cost

QWEN3_30B = {"layers": 48, "top_k": 8}


def test_qwen3_30b_a3b_at_the_issue_sizes():
    """48 layers x top-8 int16 = 768 B/token; a 16k-token response 12.6 MB; 512 x 16 of them 103 GB."""
    cost = routing_cost("R3", **QWEN3_30B, batch=512, n=16, prompt_length=1, response_length=16384 - 1)
    assert cost.bytes_per_token == 768
    assert cost.per_response == 16384 * 768 == 12_582_912
    assert cost.per_step == 512 * 16 * 12_582_912  # 103 GB
    assert cost.held_across_steps == 0 and cost.launched_responses == 8192


def test_the_prompt_is_carried_too():
    """verl aligns the routes to prompt + response rows (AgentLoopOutput.as_dict)."""
    with_prompt = routing_cost("R3", **QWEN3_30B, batch=1, n=1, prompt_length=1024, response_length=16384)
    assert with_prompt.per_response == (1024 + 16384) * 768


def test_over_sampling_launches_more_and_continue_holds_the_aborted():
    restart = routing_cost("R3", **QWEN3_30B, batch=32, n=16, prompt_length=1024, response_length=16384,
                           over_sample_ratio=0.25)
    cont = routing_cost("R3", **QWEN3_30B, batch=32, n=16, prompt_length=1024, response_length=16384,
                        over_sample_ratio=0.25, continue_partial=True)
    per_response = 17408 * 768
    assert launched_prompts(32, 0.25) == 40
    assert restart.per_step == cont.per_step == 40 * 16 * per_response
    assert restart.held_across_steps == 0
    assert cont.held_across_steps == 8 * 16 * per_response  # the 8 groups that lost the race
    assert cont.total == 48 * 16 * per_response


def test_launched_prompts_rounds_up_like_the_controller():
    assert launched_prompts(10, 0.25) == 13  # ceil(12.5)
    assert launched_prompts(8, 0.25) == 10  # exact, no float creep to 11
    assert launched_prompts(7, 0.0) == 7


def test_r2_moves_only_trained_responses_and_holds_nothing():
    r2 = routing_cost("R2", **QWEN3_30B, batch=32, n=16, prompt_length=1024, response_length=16384,
                      over_sample_ratio=0.25, continue_partial=True)
    assert r2.per_step == 32 * 16 * 17408 * 768 and r2.held_across_steps == 0


def test_off_costs_nothing():
    off = routing_cost("off", **QWEN3_30B, batch=512, n=16, prompt_length=1024, response_length=16384)
    assert (off.per_step, off.held_across_steps, off.per_response) == (0, 0, 0)
    assert describe(off).startswith("off")


@pytest.mark.parametrize("kwargs", [{"layers": 0, "top_k": 8}, {"layers": 48, "top_k": 0}])
def test_a_model_without_routing_is_refused(kwargs):
    with pytest.raises(ValueError, match="layers >= 1 and top_k >= 1"):
        routing_cost("R3", **kwargs, batch=1, n=1, prompt_length=1, response_length=1)


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="one of"):
        routing_cost("R4", **QWEN3_30B, batch=1, n=1, prompt_length=1, response_length=1)


def test_description_names_sizes_and_path():
    cost = routing_cost("R3", **QWEN3_30B, batch=512, n=16, prompt_length=1024, response_length=16384,
                        over_sample_ratio=0.25, continue_partial=True)
    text = describe(cost)
    assert "768 B/token" in text and "13.4 MB per response" in text and "TransferQueue" in text
    assert "held across steps" in text
    assert fmt_bytes(12_582_912) == "12.6 MB" and fmt_bytes(103e9) == "103 GB" and fmt_bytes(512) == "512 B"
