"""``ROUTER_REPLAY=off|R2|R3``: both verl keys composed (vLLM's route recording, Megatron's replay mode), the default
per engine and model, every combination verl 0.9.1 or vLLM cannot serve refused by name, and the routing data the
configuration moves stated in the summary."""
import json
import shutil

import pytest
from omegaconf import OmegaConf

from recipe.preflight import format_report, run_preflight
from recipe.preflight.router_replay import routing_memory_note
from harness.cpu_runs import CPU_RANDOM

ARR = "actor_rollout_ref"
MEG = f"{ARR}.actor.megatron"
ROLLOUT_KEY = f"{ARR}.rollout.enable_rollout_routing_replay"
MODE_KEY = f"{MEG}.router_replay.mode"


def sel(cfg, key, default=None):
    for part in key.split("."):
        if not isinstance(cfg, dict) or part not in cfg:
            return default
        cfg = cfg[part]
    return cfg


def resolved(report):
    assert report.ok, report.errors
    return OmegaConf.to_container(report.config, resolve=True)


def error_with(report, *parts):
    hits = [e for e in report.errors if all(p in e for p in parts)]
    assert hits, f"no error with {parts}:\n" + "\n".join(report.errors)
    return hits[0]


def row(report, label):
    return dict(report.table)[label]


@pytest.fixture(scope="module")
def dense_dir(qwen3_30b_dir, tmp_path_factory):
    """Qwen3-30B-A3B's config without experts: a dense model as far as verl and vLLM can tell."""
    out = tmp_path_factory.mktemp("models") / "dense"
    shutil.copytree(qwen3_30b_dir, out)
    cfg = json.loads((out / "config.json").read_text())
    for key in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step", "mlp_only_layers",
                "norm_topk_prob", "output_router_logits", "router_aux_loss_coef"):
        cfg.pop(key)
    cfg.update(model_type="qwen3", architectures=["Qwen3ForCausalLM"])
    (out / "config.json").write_text(json.dumps(cfg))
    return out


# ---- the switch -----------------------------------------------------------------------------------------------

def test_default_on_a_qwen3_moe_with_megatron_is_r3_with_both_keys(env_30b):
    report = run_preflight([], env_30b)
    c = resolved(report)
    assert report.values["ROUTER_REPLAY"] == "R3"
    assert sel(c, ROLLOUT_KEY) is True and sel(c, MODE_KEY) == "R3"
    assert sel(c, f"{ARR}.rollout.calculate_log_probs") is True  # verl's mismatch metrics need the rollout's
    assert sel(c, f"{ARR}.ref.megatron.router_replay.mode") == "disabled"  # the ref routes natively
    # 48 layers x top-8 x int16 over prompt 1024 + response 16384; 32 prompts x 16 responses per step
    assert row(report, "router replay").startswith("R3: 768 B/token (int16), up to 13.4 MB per response; 6.85 GB "
                                                   "written per step for 512 responses")
    assert report.values["EXPERIMENT_NAME"] == "qwen3-30b-a3b-grpo-resampler"  # the default arm keeps its name


@pytest.mark.parametrize("mode,rollout,megatron,suffix", [("off", False, "disabled", "-noreplay"),
                                                          ("R2", False, "R2", "-r2")])
def test_other_modes_compose_both_keys_and_get_their_own_run_dir(env_30b, mode, rollout, megatron, suffix):
    report = run_preflight([], {**env_30b, "ROUTER_REPLAY": mode})
    c = resolved(report)
    assert sel(c, ROLLOUT_KEY) is rollout and sel(c, MODE_KEY) == megatron
    assert report.values["EXPERIMENT_NAME"] == f"qwen3-30b-a3b-grpo-resampler{suffix}"
    assert row(report, "router replay").startswith("off" if mode == "off" else "R2: 768 B/token")


def test_cpu_preset_defaults_to_off_and_has_no_megatron_key(tmp_path):
    report = run_preflight([], {**CPU_RANDOM, "CKPT_ROOT": str(tmp_path)})
    c = resolved(report)
    assert report.values["ROUTER_REPLAY"] == "off"
    assert sel(c, ROLLOUT_KEY) is False and sel(c, f"{MEG}.router_replay") is None


def test_a_dense_model_defaults_to_off(env_30b, dense_dir):
    report = run_preflight([], {**env_30b, "MODEL_PATH": str(dense_dir)})
    assert report.values["ROUTER_REPLAY"] == "off"
    assert sel(OmegaConf.to_container(report.config, resolve=True), MODE_KEY) == "disabled"


# ---- what verl or vLLM cannot serve ------------------------------------------------------------------------------

def test_cpu_preset_refuses_replay_before_composition(tmp_path):
    report = run_preflight([], {**CPU_RANDOM, "CKPT_ROOT": str(tmp_path), "ROUTER_REPLAY": "R3"})
    error_with(report, "ROUTER_REPLAY=R3 with PRESET=cpu", "FSDP engine", "Unset ROUTER_REPLAY")
    assert report.config is None


def test_cpu_preset_refuses_recording_routes_through_an_override(tmp_path):
    report = run_preflight([f"{ROLLOUT_KEY}=True"], {**CPU_RANDOM, "CKPT_ROOT": str(tmp_path)})
    error_with(report, f"{ROLLOUT_KEY}=True with verl's FSDP engine", "drop the override")


def test_explicit_replay_on_a_dense_model_is_refused(env_30b, dense_dir):
    report = run_preflight([], {**env_30b, "MODEL_PATH": str(dense_dir), "ROUTER_REPLAY": "R3"})
    error_with(report, "ROUTER_REPLAY=R3", "is not a Mixture-of-Experts model", "export ROUTER_REPLAY=off")


@pytest.mark.parametrize("mode,overrides,parts", [
    ("R3", [f"{ROLLOUT_KEY}=False"], [f"{MODE_KEY}=R3 with {ROLLOUT_KEY}=False", "no routed_experts"]),
    ("R2", [f"{ROLLOUT_KEY}=True"], [f"{MODE_KEY}=R2 with {ROLLOUT_KEY}=True", "R3 under the name R2"]),
    ("off", [f"{ROLLOUT_KEY}=True"], [f"{ROLLOUT_KEY}=True with {MODE_KEY}=disabled", "never replays"]),
    ("R3", [f"{ARR}.rollout.name=sglang"], [f"{ARR}.rollout.name=sglang", "enable_return_routed_experts"]),
    ("R3", [f"{ARR}.rollout.pipeline_model_parallel_size=2"], ["pipeline_model_parallel_size=2",
                                                                "--enable-return-routed-experts"]),
    ("R3", [f"+{ARR}.rollout.engine_kwargs.vllm.kv_transfer_config={{kv_connector:NixlConnector}}"],
     ["kv_transfer_config", "KV connectors"]),
    ("R3", [f"{MEG}.pad_to_length=True"], [f"{MEG}.pad_to_length=True", "not supported with router replay"]),
    ("R2", [f"{MEG}.dynamic_context_parallel=True", f"+{MEG}.override_transformer_config.moe_router_fusion=True"],
     ["moe_router_fusion=False"]),
    ("R2", ["algorithm.rollout_correction.bypass_mode=True"], ["router_replay.mode='R2' requires "
                                                              "algorithm.rollout_correction.bypass_mode=False"]),
])
def test_combinations_verl_or_vllm_cannot_serve_are_refused(env_30b, mode, overrides, parts):
    report = run_preflight(overrides, {**env_30b, "ROUTER_REPLAY": mode})
    error_with(report, *parts)
    assert "Traceback" not in format_report(report)


def test_a_vllm_without_routed_expert_capture_is_refused(env_30b, monkeypatch):
    monkeypatch.setattr("recipe.preflight.router_replay.installed_vllm", lambda: "0.21.1")
    error_with(run_preflight([], env_30b), "ROUTER_REPLAY=R3 with vLLM 0.21.1", "below vLLM 0.22", "ROUTER_REPLAY=R2")


def test_speculative_decoding_with_r3_passes(env_30b):
    """vLLM 0.28 returns the verification pass's routes for the accepted tokens (scheduler.py, spec decode)."""
    report = run_preflight([], {**env_30b, "ROLLOUT_SPECULATIVE": "ngram"})
    assert sel(resolved(report), MODE_KEY) == "R3"


# ---- what it moves and holds ----------------------------------------------------------------------------------

def test_over_sampling_states_what_the_extra_launches_move(env_30b):
    report = run_preflight([], {**env_30b, "OVER_SAMPLE_ENABLE": "1"})
    resolved(report)
    # ceil(32 x 1.25) = 40 prompts x 16 launched, each up to 17408 tokens x 768 B; the trainer reads the 512 trained
    assert "8.56 GB written per step for 640 responses (vLLM -> agent loops -> TransferQueue); the trainer reads " \
           "164 GB per step (512 responses" in row(report, "router replay")


def test_the_trainer_reads_are_stated_per_pass_and_rank(env_30b):
    """The defaults: old log-probs, the KL loss's reference pass and the update each fetch the batch's routes, on
    each of the actor's TP 2 x PP 4 ranks of a data-parallel group: 512 x 17408 x 768 B x 3 x 8 = 164 GB a step.
    Bypass mode skips the old log-probs' pass, no KL drops the reference's."""
    text = row(run_preflight([], env_30b), "router replay")
    assert "the trainer reads 164 GB per step (512 responses x 3 passes: old log-probs, ref, update x 8 " \
           "model-parallel ranks); none held across steps" in text
    lean = run_preflight([f"{ARR}.actor.use_kl_loss=False", "algorithm.rollout_correction.bypass_mode=True"], env_30b)
    assert "the trainer reads 54.8 GB per step (512 responses x 1 passes: update x 8 model-parallel ranks)" in \
        row(lean, "router replay")


def test_vllms_routes_buffer_is_stated_per_engine(env_30b, monkeypatch):
    """vLLM 0.24 keeps one route row per KV-cache slot (uint8, 48 x 8 = 384 B; K/V in bf16: 48 x 2 x 4 x 128 x 2 =
    96 KiB a token), in each engine core's host memory; with the GPU's memory known, bounded by the KV cache
    gpu_memory_utilization leaves it: 0.39% x 0.6 x 4 x 141 GiB (an H200, TP 4) = 1.41 GB an engine, 2 engines on 8
    GPUs."""
    import recipe.preflight.report as report_module

    monkeypatch.setattr(report_module, "gpu_memory_bytes", lambda: None)
    text = row(run_preflight([], env_30b), "routes in vLLM")
    assert text.startswith("vLLM's scheduler holds 384 B of routes per KV-cache token (0.39% of the KV cache's bytes, "
                           "uint8 ids) in each engine core's host memory, allocated at start-up; each GPU worker "
                           "26.7 MB of capture buffer (int32)")  # ROLLOUT_MAX_NUM_BATCHED_TOKENS 17408 x 384 x 4
    monkeypatch.setattr(report_module, "gpu_memory_bytes", lambda: 143771 * 2**20)
    assert "at most 1.41 GB per engine, 2.83 GB for the 2 per node" in row(run_preflight([], env_30b),
                                                                           "routes in vLLM")
    off = run_preflight([], {**env_30b, "ROUTER_REPLAY": "R2"})
    assert "routes in vLLM" not in dict(off.table)


def test_over_sample_continue_keeps_r3_and_states_what_it_holds(env_30b):
    """A resumed group's finished sessions get their routes re-prefilled (recipe/adapter/routes.py): R3 is the MoE
    default with ``continue`` too, and the records kept for a resume hold no routes (the over-sampler empties them)."""
    cont = {**env_30b, "OVER_SAMPLE_ENABLE": "1", "OVER_SAMPLE_REQUEUE": "continue"}
    report = run_preflight([], cont)
    c = resolved(report)
    assert report.values["ROUTER_REPLAY"] == "R3" and sel(c, MODE_KEY) == "R3" and sel(c, ROLLOUT_KEY) is True
    assert row(report, "router replay").endswith("none held across steps")
    assert sel(resolved(run_preflight(["recipe.over_sample.requeue=continue"],
                                      {**env_30b, "OVER_SAMPLE_ENABLE": "1"})), MODE_KEY) == "R3"


def test_memory_warning_names_the_knobs_that_bound_it(env_30b, qwen3_30b_dir):
    report = run_preflight([], {**env_30b, "OVER_SAMPLE_ENABLE": "1"})
    c, hf = resolved(report), json.loads((qwen3_30b_dir / "config.json").read_text())
    notes = []
    routing_memory_note(c, hf, notes, 30 * 10**9)
    assert len(notes) == 1  # 8.56 GB per step > 25% of 30 GB
    assert "moves up to 8.56 GB of routes per step, more than 25% of this node's 30 GB of memory" in notes[0]
    assert "MAX_RESPONSE_LENGTH, TRAIN_BATCH_SIZE, ROLLOUT_N, OVER_SAMPLE_RATIO" in notes[0]
    routing_memory_note(c, hf, notes, 2 * 10**12)
    assert len(notes) == 1  # 2 TB nodes: no warning


# ---- through the script ---------------------------------------------------------------------------------------

def test_dry_run_prints_both_keys(run_script, env_30b, tmp_path, dry_run_words):
    r = run_script("train_grpo.sh", {**env_30b, "DRY_RUN": "1", "ROUTER_REPLAY": "R3",
                                     "CKPT_ROOT": str(tmp_path / "ck")}, gpus=0)
    assert r.returncode == 0, r.stdout + r.stderr
    words = dry_run_words(r.stdout)
    assert f"{ROLLOUT_KEY}=True" in words and f"{MODE_KEY}=R3" in words
    assert "router replay    R3: 768 B/token" in r.stdout
