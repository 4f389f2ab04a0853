"""A tiny Qwen3-MoE that has learned two tasks (SFT on the CPU, a few minutes), as a cached fixture.

``recipe.tiny.artifacts``'s model is random: it never stops on its own and never calls a tool, so a CPU run sees no
real length variation. This one is the same architecture (``Qwen3MoeConfig``: hidden 128, 4 layers, 8 experts
top-2, ``norm_topk_prob``, float32: vLLM's CPU backend loads it as it loads the random one), trained with plain torch
(AdamW, loss on the assistant tokens only) on the synthetic tasks of ``recipe.tiny.tasks``:

- countdown: "Count down from N." -> ``N N-1 ... 1. #### N<|im_end|>``, the length set by N, with spread
  within a prompt (a random closing sentence), so the length estimates have something to rank;
- calculator: with the calculator tool in the system prompt, a hermes ``<tool_call>{json}</tool_call>`` turn, then,
  after the ``<tool_response>``, ``The answer is R. #### R<|im_end|>``; or, in ``SFTConfig.direct_share`` of them, an
  answer at once with a wrong guess, so the model leaves RL something to learn: to call the tool (a flat reward on
  a model that always calls it showed no learning in 18 CPU steps).

Tokenizer ``tok-v2-tools``: like ``tok-v1`` (ByteLevel BPE, ``<|endoftext|>`` pad, ``<|im_end|>`` eos, ``"\\n"`` one
token) trained on the tasks' text too, with ``<tool_call>``, ``</tool_call>``, ``<tool_response>``,
``</tool_response>`` as added (non-special) tokens as in Qwen3, and Qwen3's tool-aware chat template
(``tiny_tasks.CHAT_TEMPLATE``).

Seeded and cached like ``recipe.tiny.artifacts`` (versioned names under ``default_cache_dir()``, atomic builds).
The training runs a fixed number of steps (deterministic given the seed and ``SFT_THREADS`` threads).
"""
from __future__ import annotations

import json
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from . import tasks
from .artifacts import (ENDOFTEXT, IM_END, IM_START, _atomic_build, _training_text, build_rows_parquet, default_cache_dir,
                   save_byte_level_bpe)

TOKENIZER_VERSION = "tok-v2-tools"
# v2: 3x the tool conversations per step, 600 steps, each task's loss its own mean (v1 copied the tool's reply into
# its answer 6% of the time); v3: a third of the tool prompts answered at once with a guess, 36 tool conversations
# per step (~24 with a call; 24 in all left the copying unlearnt), 750 steps (600 left the countdown's Spearman at 0.75)
SFT_VERSION = "sft-v3"
MODEL_VERSION = f"qwen3moe-{SFT_VERSION}-{TOKENIZER_VERSION}"
DATA_VERSION = "tasks-v1"
TOOL_TOKENS = (tasks.TOOL_CALL, tasks.TOOL_CALL_END, tasks.TOOL_RESPONSE, tasks.TOOL_RESPONSE_END)
SFT_THREADS = 1


@dataclass(frozen=True)
class SFTConfig:
    n_countdown: int = 3000
    n_tool: int = 1800
    steps: int = 750
    batch_tokens: int = 2048  # countdown tokens (with padding) per step
    tool_batch: int = 36  # tool conversations per step (~24 with a call, as in v2: fewer left the copying unlearnt)
    direct_share: float = 0.33  # tool prompts answered at once with a guess (tiny_tasks.direct_messages)
    lr: float = 3e-3
    warmup: int = 20
    weight_decay: float = 0.0


# ---------------------------------------------------------------- tokenizer


def _tokenizer_corpus(seed: int = 0) -> list[str]:
    rng = random.Random(f"tok-{seed}")
    text = _training_text()
    for _ in range(1500):
        text.append(tasks.render(tasks.countdown_messages(rng.randint(1, tasks.MAX_COUNT), rng)))
    for _ in range(600):
        text.append(tasks.render(tasks.tool_messages(rng)[0], tools=[tasks.CALCULATOR_TOOL]))
    return text


def build_tool_tokenizer(cache_dir: str | os.PathLike | None = None) -> Path:
    """``tok-v2-tools`` (see the module docstring). Returns the tokenizer dir."""

    def build(out: Path) -> None:
        save_byte_level_bpe(_tokenizer_corpus(), tasks.CHAT_TEMPLATE, out, added_tokens=TOOL_TOKENS)

    return _atomic_build(Path(cache_dir or default_cache_dir()) / TOKENIZER_VERSION, build, is_dir=True)


# ---------------------------------------------------------------- SFT data


def sft_conversations(cfg: SFTConfig, seed: int = 0) -> list[tuple[list[dict], list[dict] | None]]:
    """``(messages, tools)`` pairs: ``cfg.n_countdown`` countdowns (N uniform in 1..MAX_COUNT) and ``cfg.n_tool``
    calculator prompts (with the tool in the system prompt; ``cfg.direct_share`` of them answered at once with a
    guess, the rest through the tool), shuffled."""
    rng = random.Random(f"sft-{seed}")
    convs = [(tasks.countdown_messages(rng.randint(1, tasks.MAX_COUNT), rng), None) for _ in range(cfg.n_countdown)]
    convs += [((tasks.direct_messages if rng.random() < cfg.direct_share else tasks.tool_messages)(rng)[0],
               [tasks.CALCULATOR_TOOL]) for _ in range(cfg.n_tool)]
    rng.shuffle(convs)
    return convs


def encode_conversation(tokenizer, messages: list[dict], tools: list[dict] | None) -> tuple[list[int], list[int]]:
    """Token ids of the rendered conversation and its loss mask: 1 on what the model writes (each assistant turn's
    text and its ``<|im_end|>``), 0 on the rest (system, user, tool replies, turn headers, the newline after
    ``<|im_end|>``, which verl's Qwen token builder inserts itself)."""
    text = tasks.render(messages, tools)
    spans = []
    header = f"{IM_START}assistant\n"
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            start = len(tasks.render(messages[:i], tools)) + len(header)
            spans.append((start, start + len(tasks.assistant_text(m)) + len(IM_END)))
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(s <= a < e for s, e in spans)) for a, _ in enc["offset_mapping"]]
    return enc["input_ids"], mask


def _batches(lengths: list[int], batch_tokens: int, rng: random.Random) -> list[list[int]]:
    """Index batches of similar lengths, each at most ``batch_tokens`` tokens once padded, in random order."""
    order = list(range(len(lengths)))
    rng.shuffle(order)
    batches = []
    chunk = 256
    for c in range(0, len(order), chunk):
        part = sorted(order[c:c + chunk], key=lambda i: lengths[i])
        batch: list[int] = []
        for i in part:
            if batch and (len(batch) + 1) * max(lengths[j] for j in batch + [i]) > batch_tokens:
                batches.append(batch)
                batch = []
            batch.append(i)
        if batch:
            batches.append(batch)
    rng.shuffle(batches)
    return batches


def _padded(rows: list[tuple[list[int], list[int]]], pad: int):
    import torch

    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    for r, (tok, mask) in enumerate(rows):
        t = torch.tensor(tok)
        ids[r, :len(tok)] = t
        attn[r, :len(tok)] = 1
        labels[r, :len(tok)] = torch.where(torch.tensor(mask, dtype=torch.bool), t, -100)
    return ids, attn, labels


def _summed_loss(model, rows, pad: int, prefix: list[int] | None = None):
    """Summed next-token loss of ``rows`` (ids, mask). With ``prefix`` (ids every row starts with, not trained):
    the prefix runs once and its keys/values are shared by the rows, whose gradients flow back through them."""
    import torch
    from transformers import DynamicCache

    if prefix:
        rows = [(ids[len(prefix):], mask[len(prefix):]) for ids, mask in rows]
    ids, attn, labels = _padded(rows, pad)
    kwargs = {}
    if prefix:
        cache = DynamicCache(config=model.config)
        model(input_ids=torch.tensor([prefix]), past_key_values=cache, use_cache=True)
        cache.batch_repeat_interleave(len(rows))
        kwargs = dict(past_key_values=cache, use_cache=True)
        attn = torch.cat([torch.ones((len(rows), len(prefix)), dtype=torch.long), attn], dim=1)
    logits = model(input_ids=ids, attention_mask=attn, **kwargs).logits
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                             labels[:, 1:].reshape(-1), ignore_index=-100, reduction="sum")


def train_sft(model, tokenizer, cfg: SFTConfig, seed: int = 0, log=None) -> list[float]:
    """Train ``model`` in place: ``cfg.steps`` AdamW steps (linear warmup, cosine decay to 10%), loss on the
    assistant tokens only (per task, the mean over its trained tokens; the two means summed). Each step has both tasks: a batch of countdowns of
    similar lengths (``cfg.batch_tokens`` tokens with padding) and ``cfg.tool_batch`` tool conversations, which share
    their system prompt (the tools block) through one key/value cache. Returns the per-step losses."""
    import math

    import torch

    convs = sft_conversations(cfg, seed)
    count = [encode_conversation(tokenizer, m, t) for m, t in convs if t is None]
    tool = [encode_conversation(tokenizer, m, t) for m, t in convs if t is not None]
    prefix = tokenizer(tasks.render([{"role": "user", "content": ""}], [tasks.CALCULATOR_TOOL]).split(
        f"{IM_START}user")[0], add_special_tokens=False)["input_ids"]
    assert all(ids[:len(prefix)] == prefix for ids, _ in tool), "tool conversations must share the system prompt"
    rng = random.Random(f"batches-{seed}")
    pad = tokenizer.pad_token_id
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), weight_decay=cfg.weight_decay)

    def lr_at(step: int) -> float:
        if step < cfg.warmup:
            return cfg.lr * (step + 1) / cfg.warmup
        p = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
        return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))

    model.train()
    losses: list[float] = []
    count_queue: list[list[int]] = []
    tool_queue: list[int] = []
    t0 = time.time()
    for step in range(cfg.steps):
        if not count_queue:
            count_queue = _batches([len(ids) for ids, _ in count], cfg.batch_tokens, rng)
        if len(tool_queue) < cfg.tool_batch:
            order = list(range(len(tool)))
            rng.shuffle(order)
            tool_queue += order
        count_rows = [count[i] for i in count_queue.pop()]
        tool_rows = [tool[tool_queue.pop()] for _ in range(cfg.tool_batch)]
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        total = 0.0
        for rows, shared in ((count_rows, None), (tool_rows, prefix)):
            if rows:
                # each task's mean over its own trained tokens: more tool rows must not dilute the countdowns
                loss = _summed_loss(model, rows, pad, shared) / sum(sum(mask[1:]) for _, mask in rows)
                loss.backward()
                total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(total)
        if log and (step % 25 == 0 or step == cfg.steps - 1):
            log(f"step {step} loss {total:.4f} lr {lr_at(step):.2e} {time.time() - t0:.0f}s")
    model.eval()
    return losses


# ---------------------------------------------------------------- the model


def build_sft_model(cache_dir: str | os.PathLike | None = None, seed: int = 0, cfg: SFTConfig = SFTConfig(),
                    log=None) -> Path:
    """The trained tiny Qwen3-MoE (see the module docstring), with its tokenizer and ``sft_info.json`` (the
    config, the losses, the build time). Returns the model dir, a complete model path for transformers, vLLM and
    verl."""
    root = Path(cache_dir or default_cache_dir())
    tok_dir = build_tool_tokenizer(root)

    def build(out: Path) -> None:
        import torch
        from transformers import AutoTokenizer, GenerationConfig, Qwen3MoeConfig, Qwen3MoeForCausalLM
        from transformers.utils import logging as hf_logging

        # the CPU preset's first run spends most of its time here: say so (its console shows the recipe's lines)
        print(f"[recipe] training the tiny Qwen3-MoE once (~7 min on 2 cores; cached in {root})", file=sys.stderr,
              flush=True)
        hf_logging.disable_progress_bar()  # the shard writer's progress bar is noise on a console
        threads = torch.get_num_threads()
        # one thread: on a busy 2-core machine two threads make each small op ~10x slower (they wait on each other)
        torch.set_num_threads(SFT_THREADS)
        try:
            t0 = time.time()
            tok = AutoTokenizer.from_pretrained(tok_dir)
            ids = dict(bos_token_id=tok.convert_tokens_to_ids(ENDOFTEXT), eos_token_id=tok.eos_token_id,
                       pad_token_id=tok.pad_token_id)
            config = Qwen3MoeConfig(
                hidden_size=128, intermediate_size=256, moe_intermediate_size=64, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_experts=8, num_experts_per_tok=2,
                vocab_size=len(tok), max_position_embeddings=4096, dtype="float32", norm_topk_prob=True, **ids,
            )
            torch.manual_seed(seed)
            model = Qwen3MoeForCausalLM(config).to(torch.float32)
            losses = train_sft(model, tok, cfg, seed=seed, log=log)
            model.generation_config = GenerationConfig(**ids)
            model.save_pretrained(out, safe_serialization=True)
            tok.save_pretrained(out)
            info = {"version": MODEL_VERSION, "seed": seed, "config": cfg.__dict__, "threads": SFT_THREADS,
                    "build_s": round(time.time() - t0, 1), "first_losses": losses[:5], "last_losses": losses[-5:]}
            (out / "sft_info.json").write_text(json.dumps(info, indent=1) + "\n")
        finally:
            torch.set_num_threads(threads)

    return _atomic_build(root / f"{MODEL_VERSION}-s{seed}", build, is_dir=True)


# ---------------------------------------------------------------- sampling (tests, the build report)


def generate(model, tokenizer, prompt_ids: list[list[int]], max_new_tokens: int, *, do_sample: bool,
             seed: int = 0) -> list[list[int]]:
    """New tokens for each prompt (transformers' ``generate``, left-padded batch), cut after the first eos."""
    import torch

    width = max(len(p) for p in prompt_ids)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompt_ids])
    attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids])
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=attn, max_new_tokens=max_new_tokens, do_sample=do_sample,
                             temperature=1.0, top_k=0, top_p=1.0, eos_token_id=tokenizer.eos_token_id,
                             pad_token_id=pad)
    result = []
    for row in out[:, width:].tolist():
        if tokenizer.eos_token_id in row:
            row = row[: row.index(tokenizer.eos_token_id) + 1]
        else:
            row = [t for t in row if t != pad]
        result.append(row)
    return result


def prompt_ids(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
    from verl.utils.tokenizer import normalize_token_ids

    return normalize_token_ids(tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True))


def spearman(x, y) -> float:
    import numpy as np

    def ranks(v):
        v = np.asarray(v, dtype=float)
        order = np.argsort(v, kind="stable")
        r = np.empty(len(v))
        r[order] = np.arange(len(v))
        for value in np.unique(v):  # average ranks for ties
            r[v == value] = r[v == value].mean()
        return r

    return float(np.corrcoef(ranks(x), ranks(y))[0, 1])


# ---------------------------------------------------------------- parquet files and the bundle


def build_countdown_parquet(path: str | os.PathLike, n_rows: int, seed: int, split: str) -> Path:
    """``tiny_tasks.countdown_rows`` written to ``path`` (kept if it already exists). Returns the path."""
    return build_rows_parquet(path, lambda: tasks.countdown_rows(n_rows, seed, split))


def build_calculator_parquet(path: str | os.PathLike, n_rows: int, seed: int, split: str) -> Path:
    """``tiny_tasks.calculator_rows`` (``agent_name: tool_agent``) written to ``path`` (kept if it already exists)."""
    return build_rows_parquet(path, lambda: tasks.calculator_rows(n_rows, seed, split))


@dataclass(frozen=True)
class SFTArtifacts:
    model_dir: Path
    train_parquet: Path  # countdown prompts (the length task)
    test_parquet: Path
    tool_train_parquet: Path  # calculator prompts for verl's ToolAgentLoop (recipe/tools/configs/calculator.yaml)
    tool_test_parquet: Path


def sft_artifacts(cache_dir: str | os.PathLike | None = None, n_train: int = 96, n_test: int = 16,
                  seed: int = 0) -> SFTArtifacts:
    """Build (or reuse) the trained tiny model and the countdown / calculator train and test parquet files."""
    root = Path(cache_dir or default_cache_dir())
    data = root / DATA_VERSION
    return SFTArtifacts(
        model_dir=build_sft_model(root, seed=seed),
        train_parquet=build_countdown_parquet(data / f"countdown-train-n{n_train}-s{seed}.parquet", n_train, seed,
                                              "train"),
        test_parquet=build_countdown_parquet(data / f"countdown-test-n{n_test}-s{seed}.parquet", n_test, seed,
                                             "test"),
        tool_train_parquet=build_calculator_parquet(data / f"calculator-train-n{n_train}-s{seed}.parquet", n_train,
                                                    seed, "train"),
        tool_test_parquet=build_calculator_parquet(data / f"calculator-test-n{n_test}-s{seed}.parquet", n_test, seed,
                                                   "test"),
    )
