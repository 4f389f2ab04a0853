"""The environment variables of ``scripts/train_grpo.sh``: :data:`KNOBS`, their defaults and the keys they set.

``KNOBS`` is the single source of the variables; :mod:`.env` parses them, :mod:`.overrides` turns them into Hydra
overrides, and docs/training.md's table is generated from it (:func:`env_table_markdown`, ``python -m recipe.preflight
--env-table``).
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..loggers import LOGGERS, default_logger, wandb_mode

REPO_ROOT = Path(__file__).resolve().parents[2]
ARR = "actor_rollout_ref"
MEG = f"{ARR}.actor.megatron"
# verl's run_ppo merges this into the runtime env of every Ray actor (TaskRunner, workers, vLLM servers)
RAY_ENV = "+ray_kwargs.ray_init.runtime_env.env_vars"


@dataclass(frozen=True)
class Knob:
    """One environment variable: how to parse it, its default, and what it sets (for messages and docs/training.md)."""

    env: str
    kind: str  # bool | int | opt_int | float | str | choice | path | path_or_none | paths | script (bash only)
    default: str | Callable[[dict], Any] | None  # None: required (or unset for script knobs)
    sets: str  # Hydra key(s) or effect, for the table in docs/training.md
    doc: str
    default_doc: str = ""  # how a computed default is shown in the table
    minimum: float | None = None
    choices: tuple[str, ...] = ()
    group: str = ""


def _prompt_plus_response(v: dict) -> int:
    return v["MAX_PROMPT_LENGTH"] + v["MAX_RESPONSE_LENGTH"]


def _suffix_depth(v: dict) -> int:
    return 8 if v["ROLLOUT_SPECULATIVE"] == "group" else 24


def _suffix_cached(v: dict) -> int:
    return 80000 if v["ROLLOUT_SPECULATIVE"] == "group" else 10000


def _group_affinity(v: dict) -> bool:
    return v["ROLLOUT_SPECULATIVE"] == "group"


def is_cpu(v: dict) -> bool:
    """The CPU preset: verl's FSDP engine and a vLLM CPU replica instead of Megatron on GPUs."""
    return v["PRESET"] == "cpu"


def config_name(v: dict) -> str:
    """The recipe config the launch composes (``configs/``): Megatron on GPUs, verl's FSDP engine on a CPU."""
    from ..cpu.preset import CONFIG_NAME as CPU_CONFIG

    return CPU_CONFIG if is_cpu(v) else "length_aware_grpo"


def default_router_replay(v: dict) -> str:
    """``R3`` for a Mixture-of-Experts MODEL_PATH on Megatron, ``off`` otherwise (PRESET=cpu: verl's FSDP engine has
    no router replay; a dense model has no routing). Why R3: docs/training.md, "Router replay"."""
    import json

    from ..hf_config import text_config
    from .model import expert_count

    if is_cpu(v):
        return "off"
    try:
        hf = json.loads((Path(v["MODEL_PATH"]) / "config.json").read_text())
    except (OSError, ValueError, KeyError):
        return "off"  # the model check names the missing or broken config.json
    return "R3" if isinstance(hf, dict) and expert_count(text_config(hf)) else "off"


def baseline_arm(v: dict) -> str | None:
    """``"fair"`` (sampler and cap off, all else equal), ``"eager"`` (the seed's: also eager vLLM) or None."""
    if v["VLLM_EAGER_BASELINE_NO_RESAMPLE"]:
        return "eager"
    return "fair" if v["BASELINE_NO_RESAMPLE"] else None


def _experiment_name(v: dict) -> str:
    """``<model>-grpo-<variant>``: a run directory per model and comparison arm."""
    arm = baseline_arm(v)
    if arm is not None:
        variant = "baseline" if arm == "fair" else "baseline-eager"
    else:
        variant = "resampler"
        if not v["VLLM_ROLLOUT_EARLY_STOP_ENABLE"]:
            variant += "-nocap"
        elif v["VLLM_ROLLOUT_EARLY_STOP_MODE"] == "calibrated":
            variant += "-calcap"
        elif v["VLLM_ROLLOUT_EARLY_STOP_MODE"] == "budget":
            variant += "-budgetcap"
        if v["SAMPLER_INIT_FROM"] != "none" or v["SAMPLER_PRIOR_COLUMN"]:
            variant += "-warm"
        if v["OVER_SAMPLE_ENABLE"]:
            variant += "-os"
        if v["TAIL_CUT_ENABLE"]:
            variant += "-tailcut"
    model = v["PRESET"] if v["PRESET"] else re.sub(r"[^a-z0-9._-]+", "-", Path(v["MODEL_PATH"]).name.lower())
    if v.get("ROLLOUT_SPECULATIVE", "off") != "off":  # an A/B of speculation gets its own run directory
        variant += f"-{v['ROLLOUT_SPECULATIVE']}"
    if v.get("MULTI_TURN"):
        variant += "-tools"
    replay = v.get("ROUTER_REPLAY")
    if replay is not None and replay != default_router_replay(v):  # an A/B of router replay: a directory per arm
        variant += "-noreplay" if replay == "off" else f"-{replay.lower()}"
    return f"{model}-grpo-{variant}"


_P_PLUS_R = "MAX_PROMPT_LENGTH + MAX_RESPONSE_LENGTH"
_G_IN, _G_CLUSTER, _G_BATCH, _G_MEGATRON, _G_ROLLOUT, _G_TOOLS, _G_RECIPE, _G_RUN, _G_SCRIPT, _G_CONVERT = (
    "Inputs", "Cluster", "Batch, lengths, algorithm (GRPO)", "Megatron actor and ref (Qwen3-30B-A3B: 48 layers, "
    "128 experts)", "vLLM rollout", "Multi-turn tool calling", "Comparison switches, sampler, cap, over-sample",
    "Run directory, checkpoints, logging", "Script control", "Conversion (scripts/convert_hf_to_distcp.sh)",
)
TOOL_CONFIGS = REPO_ROOT / "recipe" / "tools" / "configs"

KNOBS: tuple[Knob, ...] = (
    Knob("PRESET", "choice", "", "(the defaults of the other variables)", "`cpu`: the whole recipe through verl's "
         "loop on a CPU (a tiny Qwen3-MoE trained here, CPU_MODEL; FSDP, vLLM CPU; a few minutes), the default when MODEL_PATH is unset "
         "and no GPU is visible; `smoke`: the tiny model on 1 GPU with Megatron, the default when MODEL_PATH is "
         "unset on a GPU machine", default_doc="unset", choices=("", "cpu", "smoke"), group=_G_IN),
    Knob("POLICY_PRESET", "choice", "", "(the sampler, cap, tail cut, scheduling and drafter variables)",
         "`best-onpolicy-spec`: the simulator's fastest strictly on-policy configuration of that name (tail cut at "
         "0.8 point, longest-first order, no cap; drafting with ROLLOUT_SPECULATIVE=eagle3 learning online where "
         "DRAFT_MODEL_PATH names a head, else group; `recipe/policy_presets.py`); your own variables win; its warm "
         "start is SAMPLER_INIT_FROM", default_doc="unset",
         choices=("", "best-onpolicy-spec"), group=_G_IN),
    Knob("CPU_MODEL", "choice", "trained", "(PRESET=cpu: MODEL_PATH, TRAIN_FILE, TEST_FILE, the reward, lengths, "
         "cap)", "PRESET=cpu: `trained`: the tiny model trained on countdowns (answers end with EOS at lengths the "
         "prompt sets); `random`: the random tiny model on a smoke reward (every response runs to the limit); "
         "`recipe/cpu/preset.py`", choices=("trained", "random"), group=_G_IN),
    Knob("MODEL_PATH", "path", None, f"{ARR}.model.path", "Hugging Face model dir (config.json, tokenizer, "
         "safetensors: vLLM loads it)", group=_G_IN),
    Knob("DISTCP_PATH", "path_or_none", None, f"{ARR}.{{actor,ref}}.megatron.use_dist_checkpointing=True, "
         ".dist_checkpointing_path", "Megatron dist checkpoint of MODEL_PATH for actor and ref (convert script); "
         "`none`: no dist checkpoint, Megatron-Bridge loads MODEL_PATH itself (slower start, no conversion)",
         group=_G_IN),
    Knob("ALLOW_UNNORMALISED_ROUTING", "bool", "0", "(preflight)", "1: accept a Qwen3-MoE MODEL_PATH whose "
         "config.json has `norm_topk_prob: false` (or none: transformers' default) on Megatron. Megatron-Bridge always "
         "renormalises the top-k routing weights while vLLM follows the config, so trainer and rollout would route "
         "differently (Qwen3-30B-A3B has `true`)", group=_G_IN),
    Knob("TRAIN_FILE", "paths", None, "data.train_files", "train parquet in verl RL format (comma-separated for "
         "several; `scripts/prepare_data.py` writes it)", group=_G_IN),
    Knob("TEST_FILE", "paths", None, "data.val_files", "validation parquet(s), same format", group=_G_IN),
    Knob("PROMPT_KEY", "str", "prompt", "data.prompt_key", "the files' prompt column: chat messages ({role, "
         "content}) or plain text (one user message); verl applies the model's chat template to it",
         group=_G_IN),
    Knob("ANSWER_KEY", "str", "", "+data.answer_key", "the files' answer column: it becomes "
         "`reward_model.ground_truth`, the reward's `ground_truth` (`recipe/user_data.py`); unset: the files have "
         "verl's `reward_model` column", default_doc="unset", group=_G_IN),
    Knob("REWARD_FUNCTION_PATH", "path", str(REPO_ROOT / "reward" / "math_reward.py"),
         "reward.custom_reward_function.path", "file defining the reward function (verl's custom reward: "
         "`def NAME(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float`)",
         default_doc="`<repo>/reward/math_reward.py`", group=_G_IN),
    Knob("REWARD_FUNCTION_NAME", "str", "compute_score", "reward.custom_reward_function.name",
         "function name in that file", group=_G_IN),
    Knob("NNODES", "int", "2", "trainer.nnodes", "nodes", minimum=1, group=_G_CLUSTER),
    Knob("GPUS_PER_NODE", "int", "8", "trainer.n_gpus_per_node", "GPUs per node", minimum=1, group=_G_CLUSTER),
    Knob("CUDA_DEVICE_MAX_CONNECTIONS", "int", "1", f"{RAY_ENV}.CUDA_DEVICE_MAX_CONNECTIONS", "sent to every Ray "
         "actor (Megatron configs): verl sets 1 only when the launching process itself sees a Hopper/Ampere GPU, so a "
         "GPU-less launcher with RAY_ADDRESS would lose Megatron's TP/SP communication overlap; Blackwell does not "
         "need 1 (CUDA's default is 8)", minimum=1, group=_G_CLUSTER),
    Knob("PYTHONPATH", "str", "", f"{RAY_ENV}.PYTHONPATH", "sent to every Ray actor as `<repo>` followed by this "
         "value, so a TaskRunner or worker on another node imports this checkout's `recipe` and `reward` (it replaces "
         "the PYTHONPATH the nodes had at `ray start`)", default_doc="unset", group=_G_CLUSTER),
    Knob("TRAIN_BATCH_SIZE", "int", "32", "data.train_batch_size", "prompts per step", minimum=1, group=_G_BATCH),
    Knob("GEN_BATCH_SIZE", "int", lambda v: v["TRAIN_BATCH_SIZE"], "data.gen_batch_size",
         "prompts per rollout fetch (divides TRAIN_BATCH_SIZE)", default_doc="TRAIN_BATCH_SIZE", minimum=1,
         group=_G_BATCH),
    Knob("ROLLOUT_N", "int", "16", f"{ARR}.rollout.n", "responses per prompt (GRPO group)", minimum=1,
         group=_G_BATCH),
    Knob("MAX_PROMPT_LENGTH", "int", "1024", "data.max_prompt_length", "prompt tokens", minimum=1, group=_G_BATCH),
    Knob("MAX_RESPONSE_LENGTH", "int", "16384", "data.max_response_length", "response tokens (the cap never "
         "exceeds it)", minimum=1, group=_G_BATCH),
    Knob("TOTAL_EPOCHS", "int", "3", "trainer.total_epochs", "epochs", minimum=1, group=_G_BATCH),
    Knob("ACTOR_PPO_MINI_BATCH_SIZE", "int", "8", f"{ARR}.actor.ppo_mini_batch_size",
         "prompts per optimizer update (x ROLLOUT_N responses)", minimum=1, group=_G_BATCH),
    Knob("ACTOR_LR", "float", "1e-6", f"{ARR}.actor.optim.lr", "learning rate", minimum=0, group=_G_BATCH),
    Knob("USE_KL_LOSS", "bool", "1", f"{ARR}.actor.use_kl_loss", "GRPO KL loss against the ref model "
         "(low_var_kl; the ref loads DISTCP_PATH)", group=_G_BATCH),
    Knob("KL_LOSS_COEF", "float", "0.001", f"{ARR}.actor.kl_loss_coef", "KL loss weight", minimum=0,
         group=_G_BATCH),
    Knob("ACTOR_PPO_MAX_TOKEN_LEN_PER_GPU", "int", _prompt_plus_response, f"{ARR}.actor.ppo_max_token_len_per_gpu",
         "dynamic-batch token budget per micro-batch (training); x ACTOR_CP must hold one full sequence",
         default_doc=_P_PLUS_R, minimum=1, group=_G_BATCH),
    Knob("LOG_PROB_MAX_TOKEN_LEN_PER_GPU", "int", lambda v: 2 * _prompt_plus_response(v),
         f"{ARR}.{{rollout,ref}}.log_prob_max_token_len_per_gpu", "same for the forward-only log-prob passes",
         default_doc=f"2 x ({_P_PLUS_R})", minimum=1, group=_G_BATCH),
    Knob("ACTOR_TP", "int", "2", f"{MEG}.tensor_model_parallel_size", "tensor parallel (divides the 4 KV heads)",
         minimum=1, group=_G_MEGATRON),
    Knob("ACTOR_PP", "int", "4", f"{MEG}.pipeline_model_parallel_size", "pipeline stages", minimum=1,
         group=_G_MEGATRON),
    Knob("ACTOR_CP", "int", "1", f"{MEG}.context_parallel_size", "context parallel", minimum=1,
         group=_G_MEGATRON),
    Knob("ACTOR_EP", "int", "4", f"{MEG}.expert_model_parallel_size", "expert parallel (divides num_experts)",
         minimum=1, group=_G_MEGATRON),
    Knob("ACTOR_ETP", "int", "1", f"{MEG}.expert_tensor_parallel_size", "expert tensor parallel", minimum=1,
         group=_G_MEGATRON),
    Knob("ACTOR_PP_FIRST_LAYERS", "int", "11", f"+{MEG}.override_transformer_config."
         "num_layers_in_first_pipeline_stage", "layers on the first stage (it also holds the embedding); 0 = even "
         "split", minimum=0, group=_G_MEGATRON),
    Knob("ACTOR_PP_LAST_LAYERS", "int", "11", f"+{MEG}.override_transformer_config."
         "num_layers_in_last_pipeline_stage", "layers on the last stage (output layer + logits); 0 = even split",
         minimum=0, group=_G_MEGATRON),
    Knob("ACTOR_ATTENTION_BACKEND", "choice", "auto", f"{MEG}.override_transformer_config.attention_backend",
         "Megatron's attention: `auto` lets Transformer Engine pick what is installed (cuDNN fused attention, or "
         "flash-attn when present); verl's default `flash` needs the flash-attn package (verl's image has it, a "
         "`.venv-gpu` from PyPI does not)", choices=("auto", "flash", "fused", "unfused", "local"),
         group=_G_MEGATRON),
    Knob("ACTOR_SEQUENCE_PARALLEL", "bool", "1", f"{MEG}.sequence_parallel", "Megatron sequence parallel "
         "(required with TP>1 and EP>1)", group=_G_MEGATRON),
    Knob("ACTOR_RECOMPUTE", "bool", "1", f"{MEG}.override_transformer_config.recompute_*", "full activation "
         "recompute (uniform, 1 layer): 16k-token sequences", group=_G_MEGATRON),
    Knob("ACTOR_PARAM_OFFLOAD", "bool", "1", f"{MEG}.param_offload (ref too)", "park weights on the CPU while "
         "vLLM generates", group=_G_MEGATRON),
    Knob("ACTOR_OPTIMIZER_OFFLOAD", "bool", "1", f"{MEG}.optimizer_offload", "park optimizer states on the CPU "
         "outside the update", group=_G_MEGATRON),
    Knob("ROLLOUT_TP", "int", "4", f"{ARR}.rollout.tensor_model_parallel_size", "vLLM tensor parallel per replica",
         minimum=1, group=_G_ROLLOUT),
    Knob("ROLLOUT_DP", "int", "1", f"{ARR}.rollout.data_parallel_size", "vLLM data parallel per replica",
         minimum=1, group=_G_ROLLOUT),
    Knob("ROLLOUT_EP", "int", "1", f"{ARR}.rollout.expert_parallel_size", "vLLM expert parallel (if > 1: = "
         "ROLLOUT_TP x ROLLOUT_DP)", minimum=1, group=_G_ROLLOUT),
    Knob("ROLLOUT_GPU_MEMORY_UTILIZATION", "float", "0.6", f"{ARR}.rollout.gpu_memory_utilization",
         "GPU memory share for vLLM (weights + KV cache)", minimum=0, group=_G_ROLLOUT),
    Knob("ROLLOUT_MAX_NUM_SEQS", "int", "256", f"{ARR}.rollout.max_num_seqs", "concurrent sequences per replica",
         minimum=1, group=_G_ROLLOUT),
    Knob("ROLLOUT_MAX_NUM_BATCHED_TOKENS", "int", _prompt_plus_response, f"{ARR}.rollout.max_num_batched_tokens",
         "tokens per vLLM scheduler step (chunked prefill)", default_doc=_P_PLUS_R, minimum=1, group=_G_ROLLOUT),
    Knob("ROLLOUT_SCHEDULING_POLICY", "choice", "fcfs", f"{ARR}.rollout.scheduling_policy", "vLLM's scheduler: "
         "`fcfs`, or `priority`: the recipe starts each step's longest-predicted responses first (resumed partial "
         "groups before all)", choices=("fcfs", "priority"), group=_G_ROLLOUT),
    Knob("ROLLOUT_SPECULATIVE", "choice", "off", f"+{ARR}.rollout.engine_kwargs.vllm.speculative_config",
         "vLLM speculative decoding (lossless: the same token distribution and target-model logprobs; "
         "`recipe/rollout_spec.py`): `off`; `ngram`: prompt lookup in the request's own context; `suffix`: suffix "
         "trees over prompt, own output and earlier responses (needs arctic-inference; drafts at every batch size); "
         "`group`: the recipe's drafter over the request's context, its GRPO group's running responses and the "
         "prompt's earlier responses (`recipe/drafting`; drafts at every batch size); `eagle3`: vLLM's EAGLE-3 "
         "proposer with the head at DRAFT_MODEL_PATH",
         choices=("off", "ngram", "suffix", "group", "eagle3"), group=_G_ROLLOUT),
    Knob("ROLLOUT_SPECULATIVE_TOKENS", "int", "4", "speculative_config.num_speculative_tokens", "draft tokens per "
         "request and step (suffix: the most it may draft)", minimum=1, group=_G_ROLLOUT),
    Knob("ROLLOUT_SPECULATIVE_MAX_BATCH", "int", "0",
         "speculative_config.num_speculative_tokens_per_batch_size", "draft only while a replica's step holds at most "
         "this many requests (the rollout's tail), none above (vLLM's Dynamic SD schedule); 0: at every batch size "
         "(the only choice for suffix, whose proposer asserts a fixed K until vLLM PR #46399). Default 0: at the "
         "acceptance measured on public sampled code, a tail-only schedule pays the run-wide costs of speculation "
         "for a short tail and loses to no speculation (docs/results.md)", minimum=0, group=_G_ROLLOUT),
    Knob("ROLLOUT_SPECULATIVE_NGRAM_MIN", "int", "1", "speculative_config.prompt_lookup_min", "ngram: shortest "
         "suffix of the context matched (vLLM's default 5 drafts rarely: 1.10 tokens per step on sampled code "
         "against 1.31 for 1..3, docs/results.md)", minimum=1, group=_G_ROLLOUT),
    Knob("ROLLOUT_SPECULATIVE_NGRAM_MAX", "int", "3", "speculative_config.prompt_lookup_max", "ngram: longest "
         "suffix of the context matched (with NGRAM_MIN, measured: docs/results.md)", minimum=1, group=_G_ROLLOUT),
    Knob("ROLLOUT_SPECULATIVE_SUFFIX_DEPTH", "int", _suffix_depth, "speculative_config.suffix_decoding_max_tree_depth",
         "suffix: tree depth (prefix match + draft length; vLLM's default); group: the longest match (8 accepts as "
         "much as 24 on sampled code, 1.941 vs 1.947 tokens per step: bench/group_drafter.py; 24 costs the rebuilt "
         "corpus 1.1-1.6x the CPU time per token at the same memory: bench/group_drafter_cost.py --depth 24)",
         default_doc="24; 8 with group", minimum=1, group=_G_ROLLOUT),
    Knob("ROLLOUT_SPECULATIVE_SUFFIX_CACHED", "int", _suffix_cached,
         "speculative_config.suffix_decoding_max_cached_requests",
         "suffix: earlier responses kept in the engine's global tree (FIFO; 0: prompt and own output only; vLLM's "
         "default); group: finished texts kept per engine (FIFO), an epoch of its home prompts at the users' scale "
         "(~17.9k prompts x 16 / 4 replicas = ~71.7k) with room; the preflight states the node's memory bound",
         default_doc="10000; 80000 with group", minimum=0, group=_G_ROLLOUT),
    Knob("ROLLOUT_SPECULATIVE_CORPUS_GIB", "float", "96", f"{RAY_ENV}.ROLLOUT_SPECULATIVE_CORPUS_GIB",
         "group: host memory (GiB) one engine's drafting corpus may hold, per engine (its output rank's arrays; the "
         "oldest finished responses go first, running ones never); 96 keeps an epoch of history at the users' scale "
         "(17.4k prompts x 16, ~6k-token responses; 24 keeps ~3%); the preflight states it per node at the run's "
         "shapes and checks it against the rollout nodes' memory", minimum=0, group=_G_ROLLOUT),
    Knob("DRAFT_MODEL_PATH", "path_or_none", "none", "speculative_config.model", "eagle3: the EAGLE-3 head's dir "
         "(config.json and safetensors, vLLM's or speculators' format) made for MODEL_PATH; the preflight checks its "
         "hidden size, aux layers, vocabulary and TP against the model (`recipe/preflight/draft_head.py`)",
         default_doc="unset", group=_G_ROLLOUT),
    Knob("ROLLOUT_DRAFT_ONLINE", "bool", "0", "recipe.draft_head.online", "eagle3: train the head each step on the "
         "target's hidden states the engines captured while drafting, then push it with the weight sync "
         "(`recipe/adapter/draft_learning.py`; the head is pushed and checked equal in every engine either way)",
         group=_G_ROLLOUT),
    Knob("ROLLOUT_DRAFT_TRAIN_STEPS", "int", "8", "recipe.draft_head.train_steps", "online head: optimizer steps "
         "per RL step (4096 tokens each)", minimum=1, group=_G_ROLLOUT),
    Knob("ROLLOUT_DRAFT_CAPTURE_TOKENS", "int", "16384", "recipe.draft_head.capture_tokens", "online head: tokens "
         "each engine keeps per step with their aux hidden states (float16; 16384 x 3 x 2048 x 2 B = 192 MiB for "
         "Qwen3-30B-A3B)", minimum=1, group=_G_ROLLOUT),
    Knob("ROLLOUT_DRAFT_LR", "float", "1e-4", "recipe.draft_head.lr", "online head: AdamW learning rate",
         minimum=0, group=_G_ROLLOUT),
    Knob("ROLLOUT_GROUP_AFFINITY", "bool", _group_affinity,
         f"{ARR}.rollout.router_config_path=configs/router/group_affinity.yaml",
         "route every response of a GRPO group to one vLLM replica, and a prompt's later groups back to it (its "
         "home; `recipe/adapter/router.py`, through verl's router extension point), so the group drafter sees the "
         "running siblings and the prompt's history; on with group (which the preflight refuses without it), off "
         "otherwise: its load-balance cost is in docs/results.md", default_doc="0; 1 with group", group=_G_ROLLOUT),
    Knob("MULTI_TURN", "bool", "0", f"{ARR}.rollout.multi_turn.enable, .tool_config_path, .format=hermes, "
         f"{ARR}.rollout.agent.default_agent_loop=length_capped_tool_agent", "multi-turn tool-calling rollouts through "
         "`CappedToolAgentLoop` (verl's ToolAgentLoop with the recipe's per-row token budget, per-turn seeds, "
         "priorities, and tool calls cancelled when the step aborts; `recipe/adapter/tool_agent_loop.py`): the "
         "default agent loop of rows without `agent_name` (rows with `agent_name: tool_agent` get it anyway); "
         "PRESET=cpu: the trained tiny model on calculator problems", group=_G_TOOLS),
    Knob("TOOL_CONFIG", "path", str(TOOL_CONFIGS / "calculator.yaml"), f"{ARR}.rollout.multi_turn.tool_config_path",
         "verl tool config (MULTI_TURN=1): `recipe/tools/configs/calculator.yaml` (exact arithmetic) or "
         "`python_tool.yaml` (Python in a sandbox: SANDBOX_BACKEND, docs/tools.md)",
         default_doc="`<repo>/recipe/tools/configs/calculator.yaml`", group=_G_TOOLS),
    Knob("TOOL_MAX_RESPONSE_CHARS", "int", "2048", f"{ARR}.rollout.multi_turn.max_tool_response_length",
         "characters of a tool reply the model sees (verl cuts the middle out of longer ones; verl's default 256 "
         "cuts most program outputs)", minimum=1, group=_G_TOOLS),
    Knob("BASELINE_NO_RESAMPLE", "bool", "0", "data.sampler.class_path=null, recipe.cap.enable=0, "
         "data.shuffle=True", "the fair baseline arm: verl's seeded random order, no cap, everything else as in the "
         "resampler arm (ignores the cap and sampler variables)", group=_G_RECIPE),
    Knob("VLLM_EAGER_BASELINE_NO_RESAMPLE", "bool", "0", f"{ARR}.rollout.enforce_eager=True, "
         "data.sampler.class_path=null, recipe.cap.enable=0, data.shuffle=True", "the seed's baseline arm: the fair "
         "baseline plus eager vLLM: no CUDA graphs and no torch.compile (vLLM's enforce_eager sets both "
         "compilation mode and cudagraph mode to none), so it measures the vLLM mode too", group=_G_RECIPE),
    Knob("VLLM_ROLLOUT_EARLY_STOP_ENABLE", "bool", "1", "recipe.cap.enable", "per-batch response cap (vLLM "
         "max_tokens)", group=_G_RECIPE),
    Knob("VLLM_ROLLOUT_EARLY_STOP_MODE", "choice", "seed", "recipe.cap.mode", "`seed`: min(response, max(MIN_TOKENS, "
         "FACTOR x estimate)); `calibrated`: from recent under-prediction; `budget`: the lowest cap that truncates at "
         "most BUDGET more of the batch than the length limit would", choices=("seed", "calibrated", "budget"),
         group=_G_RECIPE),
    Knob("VLLM_ROLLOUT_EARLY_STOP_BUDGET", "float", "0.007", "recipe.cap.budget.budget", "budget cap: expected extra "
         "truncated share per batch (0.007 = 0.7%)", minimum=0, group=_G_RECIPE),
    Knob("VLLM_ROLLOUT_EARLY_STOP_FACTOR", "float", "2.0", "recipe.cap.factor", "seed cap factor", minimum=0,
         group=_G_RECIPE),
    Knob("VLLM_ROLLOUT_EARLY_STOP_MIN_TOKENS", "int", "10000", "recipe.cap.min_tokens", "seed cap floor",
         minimum=1, group=_G_RECIPE),
    Knob("DATA_SEED", "int", "0", "data.seed, data.sampler.seed", "seed of the data order: verl's random order in the "
         "baseline arms, the sampler's first epoch and tie-breaks", minimum=0, group=_G_RECIPE),
    Knob("ROLLOUT_SAMPLING_SEED", "opt_int", "", "recipe.sampling_seed", "per-response vLLM seeds from (seed, epoch, "
         "row, sample): reruns and resumes draw the same random numbers (not with ROLLOUT_SPECULATIVE=group or "
         "suffix: vLLM draws at drafted positions, and their drafts depend on the engine's corpus, docs/design.md); "
         "unset: vLLM's engine RNG", default_doc="unset",
         minimum=0, group=_G_RECIPE),
    Knob("SAMPLER_INIT_FROM", "path_or_none", "none", "data.sampler.init_from", "warm start: an earlier run's "
         "`length_traces.jsonl` (or run dir) on the same prompts, matched by content; epoch 0 is then ordered and "
         "capped", default_doc="unset", group=_G_RECIPE),
    Knob("SAMPLER_PRIOR_COLUMN", "str", "", "data.sampler.prior_column", "warm start: a train-file column of expected "
         "lengths per row", default_doc="unset", group=_G_RECIPE),
    Knob("SAMPLER_BUCKET_SIZE", "float", "1024", "data.sampler.bucket_size", "tokens per length bucket",
         minimum=0, group=_G_RECIPE),
    Knob("SAMPLER_EMA_DECAY", "float", "0.7", "data.sampler.ema_decay", "weight of the old estimate (0..0.999)",
         minimum=0, group=_G_RECIPE),
    Knob("SAMPLER_SHUFFLE_BATCH_BLOCKS", "bool", "1", "data.sampler.shuffle_batch_blocks", "shuffle whole "
         "batches after sorting", group=_G_RECIPE),
    Knob("SAMPLER_STATISTIC", "str", "mean", "data.sampler.statistic", "group statistic: mean, max, median or pNN",
         group=_G_RECIPE),
    Knob("SAMPLER_ORDER_BY", "choice", "tokens", "data.sampler.order_by", "`tokens`: sort epochs by estimated "
         "response tokens; `time`: by expected rollout time, tokens + estimated tool calls x the run's mean tool "
         "latency (multi-turn; the simulator found it no faster, docs/results.md)", choices=("tokens", "time"),
         group=_G_RECIPE),
    Knob("SAMPLER_TIME_TOKENS_PER_S", "float", "120", "data.sampler.time_tokens_per_s", "SAMPLER_ORDER_BY=time: "
         "decode tokens per second of one sequence, to put tool seconds in tokens (> 0; 120: the simulator's tuned "
         "value)", minimum=0, group=_G_RECIPE),
    Knob("OVER_SAMPLE_ENABLE", "bool", "0", "recipe.over_sample.enable", "over-sample and abort the slowest groups",
         group=_G_RECIPE),
    Knob("OVER_SAMPLE_RATIO", "float", "0.25", "recipe.over_sample.ratio", "extra prompts per batch (share)",
         minimum=0, group=_G_RECIPE),
    Knob("OVER_SAMPLE_REQUEUE", "choice", "restart", "recipe.over_sample.requeue", "`restart`: aborted prompts "
         "regenerate from scratch at the back of the epoch (on-policy); `continue`: partial rollout, resumed next "
         "step", choices=("restart", "continue"), group=_G_RECIPE),
    Knob("OVER_SAMPLE_MAX_RESUMES", "int", "1", "recipe.over_sample.max_resumes", "continue: resumes per "
         "response before it restarts (bounds policy versions per response to this + 1)", minimum=0,
         group=_G_RECIPE),
    Knob("ROUTER_REPLAY", "choice", default_router_replay, f"{ARR}.rollout.enable_rollout_routing_replay, "
         f"{MEG}.router_replay.mode", "MoE router replay (docs/training.md, \"Router replay\"): `R3`: vLLM returns "
         "the experts it chose for every token and Megatron replays them in the log-prob pass and the update, so "
         "trainer and rollout route alike (Rollout Router Replay); `R2`: Megatron records its own routes in the "
         "log-prob pass and replays them in the update; `off`. The preflight states the routing data it moves per step",
         default_doc="`R3` for an MoE MODEL_PATH on Megatron; `off` for a dense model and PRESET=cpu",
         choices=("off", "R2", "R3"), group=_G_RECIPE),
    Knob("TAIL_CUT_ENABLE", "bool", "0", "recipe.tail_cut.enable", "end each step's rollout once TAIL_CUT_FRACTION of "
         "its responses are done; the rest are aborted and trained as truncated (on-policy; not with over-sampling)",
         group=_G_RECIPE),
    Knob("TAIL_CUT_FRACTION", "float", "0.975", "recipe.tail_cut.fraction", "tail cut: share of a step's responses "
         "that must be done (at level 1; the simulator's choice, docs/results.md)", minimum=0, group=_G_RECIPE),
    Knob("TAIL_CUT_LEVEL_EXPONENT", "float", "1.25", "recipe.tail_cut.level_exponent", "tail cut: a batch of level L "
         "(its mean estimate over all rows') may leave (1 - TAIL_CUT_FRACTION) x L^this unfinished; 0: the same "
         "share for every batch (needs the sampler's estimates when > 0)", minimum=0, group=_G_RECIPE),
    Knob("TAIL_CUT_MAX_EXTRA_TRUNCATION", "float", "0", "recipe.tail_cut.max_extra_truncation", "tail cut: the extra "
         "truncation you accept (e.g. 0.01: one response in 100 stopped that would have ended with EOS), held per "
         "step by a controller on what the run observes (`recipe/core/tailcut_budget.py`; TAIL_CUT_FRACTION is then "
         "only its start); 0: the fixed TAIL_CUT_FRACTION; at most 0.5, needs TAIL_CUT_ENABLE=1", minimum=0,
         group=_G_RECIPE),
    Knob("RECORD_TOKENS", "bool", "0", "recipe.record_tokens.enable", "1: keep each trained response's token ids "
         "with its row id and epoch, one gzip file per step in `<run>/tokens` (`recipe/token_record.py`): "
         "`python -m recipe.sim.acceptance <run>/tokens` and the A/B report then estimate which ROLLOUT_SPECULATIVE "
         "drafter would pay, from the first epoch on", group=_G_RECIPE),
    Knob("RECORD_TOKENS_MAX_MB", "int", "1024", "recipe.record_tokens.max_mb", "RECORD_TOKENS: the most MiB "
         "`<run>/tokens` may hold (a resumed run counts what is there); the step that would pass it stops the "
         "recording for the rest of the run, nothing recorded is deleted", minimum=1, group=_G_RECIPE),
    Knob("PROJECT_NAME", "str", "length-aware-grpo", "trainer.project_name", "wandb project", group=_G_RUN),
    Knob("EXPERIMENT_NAME", "str", _experiment_name, "trainer.experiment_name", "run name and run directory name",
         default_doc="`<model>-grpo-<variant>`, `<model>`: PRESET or MODEL_PATH's folder name in lower case; "
         "`<variant>`: `baseline` / `baseline-eager` (the two baseline arms), else `resampler` then `-nocap` / "
         "`-calcap` / `-budgetcap` (cap off, or its mode), `-warm` (SAMPLER_INIT_FROM or SAMPLER_PRIOR_COLUMN), `-os` "
         "(OVER_SAMPLE_ENABLE), `-tailcut` (TAIL_CUT_ENABLE); then, for any arm, `-ngram` / `-suffix` / `-group` "
         "(ROLLOUT_SPECULATIVE), `-tools` (MULTI_TURN), `-noreplay` / `-r2` (ROUTER_REPLAY off or R2 where R3 is the "
         "default); e.g. POLICY_PRESET=best-onpolicy-spec warm-started: "
         "`qwen3-30b-a3b-grpo-resampler-nocap-warm-tailcut-group`", group=_G_RUN),
    Knob("CKPT_ROOT", "path", str(REPO_ROOT / "checkpoints"), "trainer.default_local_dir=CKPT_ROOT/EXPERIMENT_NAME",
         "parent of the run directories (shared filesystem on multi-node)", default_doc="`<repo>/checkpoints`",
         group=_G_RUN),
    Knob("SAVE_CKPT_ENABLE", "bool", "0", "trainer.save_freq, trainer.resume_mode", "1: save every "
         "TRAINER_SAVE_FREQ steps, resume from the latest (`auto`); 0: save nothing, never resume (`disable`)",
         group=_G_RUN),
    Knob("TRAINER_SAVE_FREQ", "int", "20", "trainer.save_freq", "steps between checkpoints (SAVE_CKPT_ENABLE=1)",
         minimum=1, group=_G_RUN),
    Knob("CKPT_OPTIM_FULLY_RESHARDABLE", "bool", "0", f"{MEG}.dist_ckpt_optim_fully_reshardable",
         "1: save the optimizer so that a resume may change ACTOR_TP/PP/EP (slower saves; verl's default `0` saves it "
         "`dp_reshardable`: a resume must keep the layout and may change only the data-parallel size)", group=_G_RUN),
    Knob("MAX_CKPT_TO_KEEP", "int", "2", "trainer.max_actor_ckpt_to_keep", "checkpoints kept (~0.4 TB each with "
         "optimizer)", minimum=1, group=_G_RUN),
    Knob("TRAINER_TEST_FREQ", "int", "10", "trainer.test_freq", "steps between validations (-1: never)",
         minimum=-1, group=_G_RUN),
    Knob("TRAINER_VAL_BEFORE_TRAIN", "bool", "0", "trainer.val_before_train", "validate before the first step",
         group=_G_RUN),
    Knob("LOGGER", "choice", default_logger, "trainer.logger, WANDB_MODE", "where metrics go: `wandb` (online: "
         "needs WANDB_API_KEY; project PROJECT_NAME, run EXPERIMENT_NAME), `wandb-offline` (a wandb run in the run "
         "directory; `wandb sync` uploads it), `console` (verl's metrics line per step, no wandb), `off`; the "
         "metrics file `<run>/logs/metrics.*.jsonl` is always written (`recipe/loggers.py`)",
         default_doc="`wandb` if WANDB_API_KEY is set, else `wandb-offline`", choices=LOGGERS, group=_G_RUN),
    Knob("TRAINER_LOGGER", "str", "console,file,wandb", "trainer.logger", "verl loggers; LOGGER adds or removes "
         "`wandb` and `console`", group=_G_RUN),
    Knob("WANDB_MODE", "choice", wandb_mode,
         "+ray_kwargs.ray_init.runtime_env.env_vars.WANDB_MODE", "wandb mode, also sent to the Ray actors",
         default_doc="from LOGGER: `online` for `wandb` (the default when WANDB_API_KEY is set), `offline` for "
         "`wandb-offline`, else `disabled`", choices=("online", "offline", "disabled"), group=_G_RUN),
    Knob("WANDB_API_KEY", "script", None, "(environment only)", "wandb key; on a multi-node cluster export it on "
         "every node before `ray start` (it is never written into the config)", default_doc="unset", group=_G_RUN),
    Knob("DRY_RUN", "script", "0", "(script)", "1: preflight (the GPU stack too on a GPU node), print the resolved "
         "settings and the levers that are on, write the launch command to a file it names, exit",
         group=_G_SCRIPT),
    Knob("PREFLIGHT_DUMP", "script", None, "(script)", "write the resolved config and overrides as JSON to this "
         "path", default_doc="unset", group=_G_SCRIPT),
    Knob("RECIPE_PYTHON", "script", None, "(script)", "Python to use (else `.venv-gpu`, a `python3` with verl, a new "
         "`.venv-gpu` on a GPU machine, or the CPU `.venv`)", default_doc="unset", group=_G_SCRIPT),
    Knob("RECIPE_VENV", "script", None, "(script)", "the CPU venv's directory (default `.venv` in the checkout; "
         "`scripts/bootstrap_venv.sh` creates or refreshes it)", default_doc=".venv", group=_G_SCRIPT),
    Knob("RECIPE_CONSOLE", "script", "quiet", "(script)", "quiet: the terminal shows the preflight, the recipe's "
         "line per step and where the logs are, the rest goes to the run's console log; full: everything",
         group=_G_SCRIPT),
    Knob("CPU_RUN_TIMEOUT_S", "script", "1800", "(script)", "PRESET=cpu: hard limit of the run; the whole process "
         "tree (Ray, vLLM, FSDP workers) is ended with it", group=_G_SCRIPT),
    Knob("RAY_ADDRESS", "script", None, "(ray.init)", "join a running Ray cluster (multi-node); no local GPU "
         "needed on the launching machine", default_doc="unset", group=_G_SCRIPT),
    Knob("CONVERT_PP", "script", "1", "--pp_size", "pipeline ranks of the conversion (each loads the whole HF "
         "model into host memory; the checkpoint is resharded at load, so one rank is enough)", group=_G_CONVERT),
    Knob("CONVERT_EP", "script", "1", "--ep_size", "expert ranks of the conversion (same)", group=_G_CONVERT),
    Knob("CONVERT_NNODES", "script", "ceil(PP x EP / GPUS_PER_NODE)", "torchrun --nnodes", "nodes; > 1 needs "
         "NODE_RANK and MASTER_ADDR on each node", group=_G_CONVERT),
    Knob("CONVERT_CPU_INIT", "script", "0", "--use_cpu_initialization", "build the Megatron model in host "
         "memory (one rank on a small GPU)", group=_G_CONVERT),
    Knob("NODE_RANK", "script", None, "torchrun --node_rank", "this node's rank (CONVERT_NNODES > 1)",
         default_doc="unset", group=_G_CONVERT),
    Knob("MASTER_ADDR", "script", None, "torchrun --master_addr", "node 0's address (CONVERT_NNODES > 1)",
         default_doc="unset", group=_G_CONVERT),
    Knob("MASTER_PORT", "script", "29500", "torchrun --master_port", "rendezvous port (CONVERT_NNODES > 1)",
         group=_G_CONVERT),
)
KNOB = {k.env: k for k in KNOBS}

# The variables the recipe reads besides KNOBS: set by the script for its own processes, or read by the tool sandbox
# (recipe/tools, docs/tools.md; also SANDBOX_<LIMIT> for each field of recipe/tools/limits.py's SandboxLimits).
ALLOW_VARIABLES = "RECIPE_ALLOW_VARIABLES"
OTHER_VARIABLES: dict[str, str] = {
    ALLOW_VARIABLES: "comma-separated names the preflight leaves alone though they look like a misspelled variable "
                     "(a shell's own, e.g. NODES)",
    "RECIPE_LAUNCH_STAMP": "scripts/train_grpo.sh: names this launch's log files",
    "RECIPE_STACK_TARGET": "scripts/train_grpo.sh: the stack the preflight requires (gpu or cpu)",
    "RECIPE_FIXTURE_CACHE": "where PRESET=cpu / smoke build and reuse the tiny model and data",
    "RECIPE_REQUIRE_SANDBOX": "1: a missing tool sandbox is an error (recipe/tools/sandbox.py)",
    "SANDBOX_BACKEND": "the tool sandbox (recipe/tools/sandbox.py)",
    "SANDBOX_PYTHON": "the sandbox's Python", "SANDBOX_BWRAP": "the bubblewrap binary",
    "SANDBOX_SCRATCH_ROOT": "the sandbox's scratch root", "SANDBOX_FUSION_URL": "a SandboxFusion server",
    "OUT": "python -m recipe.megatron_check: the folder a lent GPU machine sends back",
    "RECIPE_GPU_CAPABILITY": "the rollout GPUs' compute capability where none is visible (router_replay.py)",
}
# The recipe's own name families: a set variable that starts with one of these and is not declared is a mistake.
# Never a bare VLLM_, RAY_, WANDB_, CUDA_ ...: those projects read their own variables of those names.
RECIPE_PREFIXES = ("VLLM_ROLLOUT_EARLY_STOP_", "VLLM_EAGER_BASELINE_", "ROLLOUT_", "SAVE_CKPT_", "CKPT_", "SAMPLER_",
                   "TAIL_CUT_", "OVER_SAMPLE_", "ACTOR_", "TRAINER_", "RECORD_TOKENS_", "REWARD_FUNCTION_", "TOOL_",
                   "BASELINE_", "POLICY_PRESET", "CPU_MODEL", "CONVERT_", "SANDBOX_")
# Other projects' and the system's namespaces: a variable there is never refused for being close to a declared name.
FOREIGN_PREFIXES = ("VLLM_", "RAY_", "VERL_", "CUDA_", "NCCL_", "NVIDIA_", "NVTE_", "WANDB_", "HF_", "HUGGINGFACE_",
                    "TRANSFORMERS_", "TORCH", "PYTORCH_", "TRITON_", "OMP_", "MKL_", "KMP_", "TOKENIZERS_", "PYTHON",
                    "PIP_", "UV_", "VIRTUAL_ENV", "CONDA_", "MASTER_", "LOCAL_", "NODE_", "WORLD_", "RANK", "SLURM_",
                    "PMI_", "OMPI_", "LC_", "XDG_", "SSH_", "LD_", "GIT_", "PYTEST_", "DO_NOT_TRACK")
# The real run's inputs: set without MODEL_PATH (and without PRESET), they mean the real run, never a preset's
REAL_RUN_INPUTS = tuple(k.env for k in KNOBS if k.default is None and k.kind != "script" and k.env != "MODEL_PATH")


def _default_text(knob: Knob) -> str:
    return knob.default_doc or (f"`{knob.default}`" if isinstance(knob.default, str) else "")



def env_table_markdown() -> str:
    """The one table of variables (docs/training.md), generated from ``KNOBS``."""
    out = ["| Variable | Default | Sets | Meaning |", "|---|---|---|---|"]
    group = None
    for k in KNOBS:
        if k.group != group:
            group = k.group
            out.append(f"| **{group}** | | | |")
        default = "**required**" if k.default is None and k.kind != "script" else (_default_text(k) or "unset")
        sets = k.sets[1:-1] if k.sets.startswith("(") else f"`{k.sets}`"
        out.append(f"| `{k.env}` | {default} | {sets} | {k.doc} |")
    return "\n".join(out)

