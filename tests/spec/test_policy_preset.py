"""POLICY_PRESET=best-onpolicy-spec (recipe/policy_presets.py): the simulator's policy of that name, as variables."""
from recipe.policy_presets import POLICY_PRESETS, policy_env
from harness.cpu_runs import CPU_RANDOM


def test_the_preset_is_the_simulators_policy():
    from recipe.sim.policies import POLICIES

    p, v = POLICIES["best-onpolicy-spec"], POLICY_PRESETS["best-onpolicy-spec"]
    assert (float(v["SAMPLER_EMA_DECAY"]), v["SAMPLER_STATISTIC"], float(v["SAMPLER_BUCKET_SIZE"])) == \
        (p.ema_decay, p.statistic, p.bucket_size)
    assert p.priority == "longest_first" and v["ROLLOUT_SCHEDULING_POLICY"] == "priority"
    assert p.cap in (None, "none") and v["VLLM_ROLLOUT_EARLY_STOP_ENABLE"] == "0"
    assert (float(v["TAIL_CUT_FRACTION"]), float(v["TAIL_CUT_LEVEL_EXPONENT"]),
            float(v["TAIL_CUT_MAX_EXTRA_TRUNCATION"])) == (p.tail_cut, p.tail_cut_exponent, p.tail_cut_budget)
    assert p.speculate == "always" and v["ROLLOUT_SPECULATIVE"] == "group" and v["ROLLOUT_SPECULATIVE_MAX_BATCH"] == "0"
    assert p.warm_start == "previous_run"  # the user's SAMPLER_INIT_FROM: not a preset value


def test_a_head_makes_the_preset_draft_with_it_learning_online(tmp_path):
    """With DRAFT_MODEL_PATH the simulator's first drafter (python -m recipe.sim.learned: eagle3 online), else group."""
    from recipe.policy_presets import preset_values

    with_head = policy_env({"POLICY_PRESET": "best-onpolicy-spec", "DRAFT_MODEL_PATH": str(tmp_path)})
    assert with_head["ROLLOUT_SPECULATIVE"] == "eagle3" and with_head["ROLLOUT_DRAFT_ONLINE"] == "1"
    for unset in ("", "none"):
        assert preset_values("best-onpolicy-spec", {"DRAFT_MODEL_PATH": unset})["ROLLOUT_SPECULATIVE"] == "group"
    mine = policy_env({"POLICY_PRESET": "best-onpolicy-spec", "DRAFT_MODEL_PATH": str(tmp_path),
                       "ROLLOUT_DRAFT_ONLINE": "0"})
    assert mine["ROLLOUT_DRAFT_ONLINE"] == "0"  # a frozen head, the user's choice


def test_explicit_variables_win_and_no_preset_changes_nothing():
    env = policy_env({"POLICY_PRESET": "best-onpolicy-spec", "TAIL_CUT_MAX_EXTRA_TRUNCATION": "0.005",
                      "ROLLOUT_SPECULATIVE": ""})
    assert env["TAIL_CUT_MAX_EXTRA_TRUNCATION"] == "0.005" and env["ROLLOUT_SPECULATIVE"] == "group"
    assert policy_env({"TAIL_CUT_ENABLE": "0"}) == {"TAIL_CUT_ENABLE": "0"}


def test_the_preflight_composes_the_preset():
    from recipe.preflight import run_preflight

    report = run_preflight([], {**CPU_RANDOM, "POLICY_PRESET": "best-onpolicy-spec"})
    assert report.ok, report.errors
    v = report.values
    assert v["ROLLOUT_SPECULATIVE"] == "group" and v["ROLLOUT_GROUP_AFFINITY"] is True and v["TAIL_CUT_ENABLE"] is True
    assert v["ROLLOUT_SCHEDULING_POLICY"] == "priority" and v["SAMPLER_EMA_DECAY"] == 0.3
