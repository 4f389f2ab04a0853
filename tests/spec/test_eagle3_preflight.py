"""``ROLLOUT_SPECULATIVE=eagle3``: the override (``recipe/rollout_spec.py``) and the head checked against the model
(``recipe/preflight/draft_head.py``), each misfit named: hidden size, aux layers, vocabulary and draft map, TP."""
import json

import pytest

from recipe import rollout_spec
from recipe.preflight import run_preflight
from recipe.preflight.draft_head import check_draft_head, head_problems, read_head
from recipe.drafting.eagle3_model import head_config as _head_config
from recipe.tiny.eagle3_head import AUX_LAYERS
from harness.cpu_runs import CPU_RANDOM

# the tiny Qwen3-MoE's config.json (recipe/tiny/artifacts.py)
TARGET = {"hidden_size": 128, "num_hidden_layers": 4, "vocab_size": 978, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 4096}
H, V = 128, 978


def write_head(path, drop=(), fc_inputs=3, d2t=None, lm_head=False, **config):
    """A head dir: ``_head_config(TARGET, AUX_LAYERS)`` with ``config`` over it (None deletes a key), and safetensors of the
    shapes vLLM loads."""
    import torch
    from safetensors.torch import save_file

    conf = {**_head_config(TARGET, AUX_LAYERS), **config}
    conf = {k: v for k, v in conf.items() if v is not None and k not in drop}
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(conf))
    hidden, draft = conf["hidden_size"], conf.get("draft_vocab_size") or V
    tensors = {"fc.weight": torch.zeros(hidden, fc_inputs * conf.get("target_hidden_size", hidden)),
               "norm.weight": torch.ones(hidden), "midlayer.self_attn.q_proj.weight": torch.zeros(hidden, 2 * hidden)}
    if lm_head:
        tensors["lm_head.weight"] = torch.zeros(draft, hidden)
    if d2t is not None:
        tensors["d2t"] = torch.tensor(d2t, dtype=torch.int64)
    save_file(tensors, str(path / "model.safetensors"))
    return path


def problems(path, tp=1, target=TARGET):
    return head_problems(read_head(path), target, tp)


def test_the_tiny_head_fits_the_tiny_model(tmp_path):
    head = read_head(write_head(tmp_path))
    assert (head.arch, head.aux_layer_ids, head.draft_vocab_size) == ("LlamaForCausalLMEagle3", (1, 2, 3), V)
    assert head_problems(head, TARGET, 1) == [] and head_problems(head, TARGET, 2) == []


def test_a_head_for_another_model_is_named(tmp_path):
    found = problems(write_head(tmp_path / "wide", hidden_size=256, target_hidden_size=256))
    assert any("reads hidden states of size 256" in p and "MODEL_PATH's hidden_size is 128" in p for p in found)
    assert any("no embed_tokens or lm_head of its own" in p for p in found), found
    found = problems(write_head(tmp_path / "vocab", vocab_size=151936, draft_vocab_size=32000, lm_head=True))
    assert any("vocab_size=151936, MODEL_PATH's is 978" in p for p in found), found


def test_aux_layers_the_model_cannot_give_are_named(tmp_path):
    """vLLM's default for 4 layers, (2, 2, 1), gives the fc two hidden states where it takes three (the shape error
    vLLM would raise at the first draft); ids past the last layer, and a permuted order, are named too."""
    found = problems(write_head(tmp_path / "default", eagle_aux_hidden_state_layer_ids=None))
    assert len(found) == 1 and "fc takes 3 hidden states" in found[0] and "(2, L // 2, L - 3)" in found[0], found
    assert "give 2 distinct ones" in found[0] and "e.g. [1, 2, 3]" in found[0]
    deep = problems(write_head(tmp_path / "deep", eagle_aux_hidden_state_layer_ids=[2, 23, 45]))
    assert len(deep) == 1 and "[23, 45], outside MODEL_PATH's 0..4" in deep[0], deep
    order = problems(write_head(tmp_path / "order", eagle_aux_hidden_state_layer_ids=[3, 1, 2]))
    assert len(order) == 1 and "not ascending" in order[0], order
    short = problems(write_head(tmp_path / "short", fc_inputs=2))  # the fc's width decides, not the list
    assert len(short) == 1 and "fc takes 2 hidden states" in short[0], short


def test_a_draft_vocabulary_needs_its_map(tmp_path):
    small = 480
    found = problems(write_head(tmp_path / "nomap", draft_vocab_size=small, lm_head=True))
    assert len(found) == 1 and "has no d2t map" in found[0], found
    ok = list(range(small))  # draft id i -> token 2i
    assert problems(write_head(tmp_path / "map", draft_vocab_size=small, lm_head=True, d2t=ok)) == []
    clash = [0] * small
    clash[1] = -1  # draft ids 0 and 1 both -> token 0
    found = problems(write_head(tmp_path / "clash", draft_vocab_size=small, lm_head=True, d2t=clash))
    assert len(found) == 1 and "distinct tokens below 978" in found[0], found
    found = problems(write_head(tmp_path / "shared", draft_vocab_size=small, d2t=ok))
    assert any("no lm_head of its own" in p and "draft_vocab_size=480" in p for p in found), found


def test_tp_that_cannot_shard_the_head_is_named(tmp_path):
    path = write_head(tmp_path)
    found = problems(path, tp=8)
    assert any("ROLLOUT_TP=8 does not divide the head's num_attention_heads=4" in p for p in found), found
    assert any("num_key_value_heads=2" in p for p in problems(path, tp=3))


def test_an_unknown_head_architecture_is_named(tmp_path):
    found = problems(write_head(tmp_path, architectures=["Qwen3MoeForCausalLM"]))
    assert any("vLLM has no EAGLE-3 head Eagle3Qwen3MoeForCausalLM" in p for p in found), found


def test_the_speculators_format_is_read(tmp_path):
    """The ``speculators`` library's format (vLLM's ``SpeculatorsConfig``): layer fields under
    ``transformer_layer_config``, the EAGLE-3 ones at the top."""
    top = ("architectures", "draft_vocab_size", "target_hidden_size", "eagle_aux_hidden_state_layer_ids")
    layer = {k: v for k, v in _head_config(TARGET, AUX_LAYERS).items() if k not in top}
    conf = {"speculators_model_type": "eagle3", "transformer_layer_config": layer, "draft_vocab_size": V,
            "target_hidden_size": H, "eagle_aux_hidden_state_layer_ids": [1, 2, 4],
            "speculators_config": {"proposal_methods": [{"speculative_tokens": 3}], "verifier": {"name_or_path": "x"}}}
    write_head(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(conf))
    head = read_head(tmp_path)
    assert (head.arch, head.aux_layer_ids, head.hidden_size) == ("Eagle3LlamaForCausalLM", (1, 2, 4), H)
    assert head_problems(head, TARGET, 1) == []


def test_a_missing_head_is_named(tmp_path):
    with pytest.raises(ValueError, match="DRAFT_MODEL_PATH=.* has no config.json"):
        read_head(tmp_path / "nowhere")


def spec_values(**kw):
    return {"ROLLOUT_SPECULATIVE": "eagle3", "ROLLOUT_SPECULATIVE_TOKENS": 3, "ROLLOUT_SPECULATIVE_MAX_BATCH": 0,
            "ROLLOUT_SPECULATIVE_SUFFIX_DEPTH": 24, "ROLLOUT_SPECULATIVE_SUFFIX_CACHED": 10000,
            "ROLLOUT_MAX_NUM_SEQS": 64, "DRAFT_MODEL_PATH": "/heads/tiny eagle3", **kw}


def test_eagle3_override_names_the_head():
    spec = rollout_spec.speculative_config(spec_values())
    assert spec == {"method": "eagle3", "num_speculative_tokens": 3, "model": "/heads/tiny eagle3"}
    assert rollout_spec.hydra_override(spec_values())[0].endswith(
        "speculative_config={method:eagle3,num_speculative_tokens:3,model:'/heads/tiny eagle3'}")
    with_schedule = rollout_spec.speculative_config(spec_values(ROLLOUT_SPECULATIVE_MAX_BATCH=8))
    assert with_schedule[rollout_spec.SCHEDULE] == [[1, 8, 3], [9, 64, 0]]  # vLLM hands EAGLE the schedule's K
    with pytest.raises(ValueError, match="ROLLOUT_SPECULATIVE=eagle3 needs DRAFT_MODEL_PATH"):
        rollout_spec.speculative_config(spec_values(DRAFT_MODEL_PATH="none"))


def test_preflight_names_a_missing_head_and_composes_a_present_one(tmp_path):
    missing = run_preflight([], {**CPU_RANDOM, "ROLLOUT_SPECULATIVE": "eagle3", "DRAFT_MODEL_PATH": "none"})
    assert any("ROLLOUT_SPECULATIVE=eagle3 needs DRAFT_MODEL_PATH" in e for e in missing.errors), missing.errors
    built = run_preflight([], {**CPU_RANDOM, "ROLLOUT_SPECULATIVE": "eagle3"})  # PRESET=cpu: its tiny head
    assert built.ok and "/eagle3-v1-" in built.values["DRAFT_MODEL_PATH"], (built.errors, built.values)
    head = write_head(tmp_path / "head")
    report = run_preflight([], {**CPU_RANDOM, "ROLLOUT_SPECULATIVE": "eagle3", "DRAFT_MODEL_PATH": str(head)})
    assert report.ok, report.errors
    spec = report.config.actor_rollout_ref.rollout.engine_kwargs.vllm.speculative_config
    assert (spec.method, spec.model) == ("eagle3", str(head))
    assert report.values["EXPERIMENT_NAME"] == "cpu-grpo-resampler-eagle3"
    from omegaconf import OmegaConf

    cfg = OmegaConf.to_container(report.config)
    errors, notes = [], []
    check_draft_head(cfg, TARGET, errors, notes)
    assert errors == [] and "reading layers [1, 2, 3] of 4" in notes[0], (errors, notes)
    check_draft_head(cfg, {**TARGET, "num_hidden_layers": 2}, errors, notes)
    assert errors and "[3], outside MODEL_PATH's 0..2" in errors[0], errors


@pytest.mark.slow
def test_vllm_builds_an_eagle3_config_from_verls_command_line(tmp_path, tiny_artifacts):
    """What verl hands vLLM for ``ROLLOUT_SPECULATIVE=eagle3`` (``--speculative_config`` JSON) becomes an EAGLE-3
    drafter on the head's three aux layers."""
    from verl.workers.rollout.vllm_rollout.utils import build_cli_args_from_config
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    target = json.loads((tiny_artifacts.model_dir / "config.json").read_text())
    head = write_head(tmp_path / "head", vocab_size=target["vocab_size"], draft_vocab_size=target["vocab_size"])
    assert head_problems(read_head(head), target, 1) == []
    spec = rollout_spec.speculative_config(spec_values(DRAFT_MODEL_PATH=str(head)))
    cli = build_cli_args_from_config({"speculative_config": spec})
    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    args = parser.parse_args(["--model", str(tiny_artifacts.model_dir), "--dtype", "float32", "--max-model-len", "512",
                              "--max-num-seqs", "64", "--enforce-eager", *cli])
    config = AsyncEngineArgs.from_cli_args(args).create_engine_config()
    s = config.speculative_config
    assert (s.method, s.num_speculative_tokens, s.model) == ("eagle3", 3, str(head))
    assert s.draft_model_config.architectures == ["LlamaForCausalLMEagle3"]
    assert list(s.draft_model_config.hf_config.eagle_aux_hidden_state_layer_ids) == [1, 2, 3]


def test_online_learning_without_an_eagle3_head_is_refused(tmp_path):
    report = run_preflight([], {**CPU_RANDOM, "ROLLOUT_DRAFT_ONLINE": "1"})
    assert any("ROLLOUT_DRAFT_ONLINE=1" in e and "ROLLOUT_SPECULATIVE=eagle3" in e for e in report.errors), report.errors
    head = write_head(tmp_path / "head", num_hidden_layers=2)  # a two-layer head: not what the online trainer trains
    report = run_preflight([], {**CPU_RANDOM, "ROLLOUT_SPECULATIVE": "eagle3", "DRAFT_MODEL_PATH": str(head),
                                "ROLLOUT_DRAFT_ONLINE": "1"})
    assert any("one-layer EAGLE-3 Llama head" in e for e in report.errors), report.errors
