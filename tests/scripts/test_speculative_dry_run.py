"""``ROLLOUT_SPECULATIVE`` through ``bash scripts/train_grpo.sh`` (DRY_RUN, the CPU preset): the launch command carries
vLLM's speculative_config as one Hydra override, and a bad value stops the preflight by name."""
OVERRIDE = ("+actor_rollout_ref.rollout.engine_kwargs.vllm.speculative_config={method:ngram,num_speculative_tokens:3,"
            "prompt_lookup_min:1,prompt_lookup_max:3}")


def test_dry_run_with_ngram_prints_the_speculative_override(run_script, tmp_path, dry_run_words):
    env = {"DRY_RUN": "1", "CKPT_ROOT": str(tmp_path / "ck"), "ROLLOUT_SPECULATIVE": "ngram",
           "ROLLOUT_SPECULATIVE_TOKENS": "3"}
    r = run_script("train_grpo.sh", env, gpus=0)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "preflight: OK" in r.stdout
    words = dry_run_words(r.stdout)
    assert OVERRIDE in words  # one shell word: the braces and commas are quoted
    assert "actor_rollout_ref.rollout.disable_log_stats=False" in words  # vLLM's counters for rollout/spec_*


def test_dry_run_with_a_bad_method_names_the_variable(run_script, tmp_path):
    r = run_script("train_grpo.sh", {"DRY_RUN": "1", "CKPT_ROOT": str(tmp_path / "ck"),
                                     "ROLLOUT_SPECULATIVE": "medusa"}, gpus=0)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "preflight: ERROR: ROLLOUT_SPECULATIVE='medusa' must be one of 'off', 'ngram', 'suffix'" in r.stdout
    assert "Traceback" not in r.stdout + r.stderr
