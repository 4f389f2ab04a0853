"""MoE routing capture (R3's ``enable_return_routed_experts``) on vLLM's real CPU engine, with the recipe plugin's
fix (recipe/cpu/vllm_plugin.py, defect 4): vLLM returns, per request, the experts the model routed each token to.

vLLM's contract (v0.28, ``Scheduler.update_from_output`` and ``RoutedExpertsManager``):
``RequestOutput.outputs[0].routed_experts`` is a ``uint8`` array (``uint16`` above 256 experts), only on the final
output, of shape ``(prompt + response - 1, num_hidden_layers, num_experts_per_tok)``: row ``i`` holds the experts
token ``i`` went through; the last sampled token was never forwarded, so it has no row. The top-k of a row is in the
kernel's order (``torch.topk(sorted=False)``), so rows are compared as sets.

Checked against a plain transformers forward of the same model on prompt + response (the top-k each gate module
returns), on two engines: plain sampling (temperature 1), and ngram speculation (greedy, so drafts are accepted; a
step's routes are then those of its accepted tokens). Each engine also reruns one long prompt: prefilled in chunks
the first time, served from the prefix cache the second (128 of its 150 tokens: those routes come from vLLM's slot
buffer, not from a forward). Measured on the tiny Qwen3-MoE (4 layers, 8 experts, top-2), per engine: 6 responses,
557 tokens x 4 layers = 2228 (token, layer) routes compared, 0 mismatches; the smallest gap between a token's 2nd and
3rd router logit was 1.7e-4, so no float tie and no tolerance. ngram drafted 153 tokens and accepted 72. Shifted by
one token (either way) the comparison mismatches in 67-87% of a response's routes (32-86% with greedy ngram). Without
the plugin's fix the engine refuses to start ("Routed-experts capture is not supported with monolithic MoE kernel
CPUUnquantizedExperts"). Both engines and the plugin's unit test: ~80-95 s on 2 cores.
"""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from recipe.route_record.paths import model_routes

ENGINE = [pytest.mark.engine, pytest.mark.slow]
K = 4  # ngram draft tokens
NGRAM = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
ARMS = {"plain": ({}, 1.0), "ngram": ({"speculative_config": NGRAM}, 0.0)}  # engine kwargs, temperature
BATCHED_TOKENS = 64  # a step's token budget: the long prompt is prefilled in chunks
_rng = np.random.default_rng(0)
LONG = [int(t) for t in _rng.integers(3, 900, 150)]
PROMPTS = [[int(t) for t in _rng.integers(3, 900, n)] for n in (7, 23, 41)] + [[5, 6, 7, 8] * 8, LONG]
LENGTHS = [32, 24, 40, 32, 16]


@pytest.fixture(scope="module")
def hf_model(tiny_artifacts):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_artifacts.model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module", params=[pytest.param(arm, marks=ENGINE) for arm in ARMS])
def run(request, tiny_artifacts, hf_model):
    """One engine per arm: every prompt once, then the long one again; the final outputs, the model's own routes of
    each prompt + response, and the engine's speculation counters. The engine is shut down before the next arm."""
    from recipe.route_record.engine import InProcessVLLM

    engine_kwargs, temperature = ARMS[request.param]
    engine = InProcessVLLM(tiny_artifacts.model_dir, max_model_len=512, max_num_seqs=8, seed=0,
                           max_num_batched_tokens=BATCHED_TOKENS, disable_log_stats=False,
                           enable_return_routed_experts=True,
                           **engine_kwargs)
    try:
        # no per-request seed: a seeded request prefilled in chunks kills vLLM CPU's engine (its runner rewinds the
        # request's generator, gpu_model_runner._bookkeeping_sync: "CPU Generator does not use offset")
        outputs = engine.run(engine.generate_forced(PROMPTS, LENGTHS, temperature=temperature))
        outputs += engine.run(engine.generate_forced([LONG], [16], temperature=temperature))
        counts = engine._counts
    finally:
        engine.shutdown()
    sequences = [list(o.prompt_token_ids) + list(o.outputs[0].token_ids) for o in outputs]
    return SimpleNamespace(arm=request.param, outputs=outputs, sequences=sequences, counts=counts,
                           hf=[model_routes(hf_model, s) for s in sequences])


def vllm_routes(output) -> np.ndarray:
    return np.sort(output.outputs[0].routed_experts.astype(np.int64), axis=-1)


def test_routing_has_a_row_per_forwarded_token(run, hf_model):
    config = hf_model.config
    for output, sequence in zip(run.outputs, run.sequences, strict=True):
        routes = output.outputs[0].routed_experts
        assert len(output.outputs[0].token_ids) > 1
        assert routes.dtype == np.uint8
        assert routes.shape == (len(sequence) - 1, config.num_hidden_layers, config.num_experts_per_tok)
        assert routes.max() < config.num_experts
        assert (np.diff(np.sort(routes, axis=-1), axis=-1) > 0).all()  # k distinct experts per token and layer


def test_routing_is_the_one_the_model_computes(run):
    compared = mismatched = 0
    min_gap = np.inf
    for output, (hf_ids, gaps) in zip(run.outputs, run.hf, strict=True):
        routes = vllm_routes(output)
        n = len(routes)
        wrong = (routes != hf_ids[:n]).any(-1)
        compared, mismatched = compared + wrong.size, mismatched + int(wrong.sum())
        min_gap = min(min_gap, float(gaps[:n].min()))
    print(f"{run.arm}: {compared} (token, layer) routes compared, {mismatched} mismatches, "
          f"smallest top-k logit gap {min_gap:.2g}")
    assert compared > 1500 and mismatched == 0


def test_a_one_token_shift_would_be_caught(run):
    """Were row ``i`` the routing of token ``i + 1`` (or ``i - 1``), the comparison above would fail."""
    shares = []
    for output, (hf_ids, _) in zip(run.outputs, run.hf, strict=True):
        routes = vllm_routes(output)
        n = len(routes)
        for shifted, reference in ((routes[:-1], hf_ids[1:n]), (routes[1:], hf_ids[:n - 1])):
            shares.append((shifted != reference).any(-1).mean())
    print(f"{run.arm}: shifted by one token, {min(shares):.0%}-{max(shares):.0%} of a response's routes mismatch")
    assert min(shares) > 0.25


def test_the_run_took_the_paths_it_is_meant_to(run):
    """The long prompt was prefilled in chunks, its rerun came from the prefix cache, and ngram accepted drafts."""
    first, rerun = run.outputs[len(PROMPTS) - 1], run.outputs[-1]
    assert len(LONG) > BATCHED_TOKENS and first.prompt_token_ids == rerun.prompt_token_ids == LONG
    print(f"{run.arm}: the rerun's prompt of {len(LONG)} tokens had {rerun.num_cached_tokens} from the prefix cache")
    assert rerun.num_cached_tokens > 0
    if run.arm == "ngram":
        print(f"ngram: {run.counts.draft_tokens} draft tokens, {run.counts.accepted} accepted")
        assert run.counts.accepted > 0
    else:
        assert run.counts.draft_tokens == 0


def test_plugin_captures_the_ids_the_cpu_kernel_routes_with(monkeypatch):
    """The runner's callback gets the ids the CPU fused MoE selects (by calling ``cpu_fused_moe.select_experts``);
    no callback, nothing recorded; a monolithic kernel that routes elsewhere raises instead of returning unwritten
    routes."""
    from vllm.model_executor.layers.fused_moe import cpu_fused_moe
    from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner

    from recipe.cpu import vllm_plugin

    logits = torch.tensor([[0.1, 2.0, -1.0, 1.5], [3.0, 0.0, 0.2, -2.0]])
    routed = []

    def kernel(self, hidden_states, router_logits, shared_experts_input, input_ids=None):  # the CPU fused MoE's part
        if self.routes_here:
            routed.append(cpu_fused_moe.select_experts(hidden_states=hidden_states, router_logits=router_logits,
                                                       use_grouped_topk=False, top_k=2, renormalize=True)[1])
        return hidden_states

    monkeypatch.setattr(MoERunner, "_apply_quant_method", kernel)
    monkeypatch.setattr(cpu_fused_moe, "select_experts", cpu_fused_moe.select_experts)
    vllm_plugin.capture_cpu_routing()
    patched = MoERunner._apply_quant_method
    vllm_plugin.capture_cpu_routing()
    assert MoERunner._apply_quant_method is patched  # idempotent: every vLLM process applies the plugin
    captured = []
    runner = SimpleNamespace(router=SimpleNamespace(capture_fn=captured.append), routes_here=True,
                             routed_experts=SimpleNamespace(quant_method=SimpleNamespace(is_monolithic=True)))
    MoERunner._apply_quant_method(runner, torch.zeros(2, 8), logits, None)
    assert len(captured) == 1 and captured[0] is routed[0]
    assert captured[0].sort(-1).values.tolist() == [[1, 3], [0, 2]]
    runner.router.capture_fn = None  # capture off: routing unchanged, nothing recorded
    MoERunner._apply_quant_method(runner, torch.zeros(2, 8), logits, None)
    assert len(captured) == 1 and len(routed) == 2
    runner.router.capture_fn, runner.routes_here = captured.append, False
    with pytest.raises(RuntimeError, match="ROUTER_REPLAY=off"):
        MoERunner._apply_quant_method(runner, torch.zeros(2, 8), logits, None)
