"""Tiny local artifacts (tokenizer, Qwen3-MoE model, math parquet) built without any hub access.

Tests and the 1-GPU smoke preset need a real tokenizer, a real Qwen3-MoE checkpoint that both transformers and vLLM
load, and parquet files in verl's RL format, but these machines cannot download anything. Everything here is
generated from a seed, so it is reproducible; builds are cached under a directory (``RECIPE_FIXTURE_CACHE``, else
``<repo>/.cache/fixtures``) whose entry names carry the builder version, so changing a builder means bumping its
version string, which rebuilds instead of reusing a stale artifact. Each build writes to a temporary sibling and
renames it into place, so a crashed or concurrent build never leaves a half-written artifact behind.

Heavy imports (tokenizers, transformers, torch, pyarrow) happen inside the builders: importing this module is cheap.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

TOKENIZER_VERSION = "tok-v1"
MODEL_VERSION = f"qwen3moe-v2-{TOKENIZER_VERSION}"
DATA_VERSION = "math-v1"

DATA_SOURCE = "recipe/tiny_math"
IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
# Qwen ChatML without the tool/think branches: one turn per message, optional assistant header.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'

_REPO_ROOT = Path(__file__).resolve().parents[2]


def default_cache_dir() -> Path:
    """``$RECIPE_FIXTURE_CACHE``, else ``<repo>/.cache/fixtures`` (git-ignored)."""
    return Path(os.environ.get("RECIPE_FIXTURE_CACHE") or _REPO_ROOT / ".cache" / "fixtures")


def _atomic_build(final: Path, build: Callable[[Path], None], *, is_dir: bool) -> Path:
    """Run ``build(tmp)`` on a temporary sibling of ``final`` and rename it into place; reuse ``final`` if present.

    One build at a time per artifact across processes: the test session and the e2e runs it launches may ask for the
    same model at once, and a second build would only burn the CPU the first one needs. The lock files live in the
    temp directory (named by the artifact's path), so the cache holds only finished artifacts."""
    if final.exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    locks = Path(tempfile.gettempdir()) / "recipe-fixture-locks"
    locks.mkdir(exist_ok=True)
    key = hashlib.sha1(str(final.resolve()).encode()).hexdigest()[:16]
    with open(locks / f"{final.name}.{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if final.exists():  # built by the process that held the lock
            return final
        return _build_into(final, build, is_dir=is_dir)


def _build_into(final: Path, build: Callable[[Path], None], *, is_dir: bool) -> Path:
    if is_dir:
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    else:
        fd, name = tempfile.mkstemp(prefix=f".{final.name}.", dir=final.parent)
        os.close(fd)
        tmp = Path(name)
    try:
        build(tmp)
        os.chmod(tmp, 0o755 if is_dir else 0o644)  # mkdtemp/mkstemp create owner-only entries
        if is_dir:
            try:
                os.rename(tmp, final)
            except OSError:
                if not final.exists():  # a concurrent build winning the race is fine, anything else is not
                    raise
        else:
            os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp) if tmp.is_dir() else tmp.unlink()
    return final


_NAMES = ("Tom", "Anna", "Liam", "Sara", "Omar", "Mia", "Noah", "Emma", "Ravi", "Yuki")
_ITEMS = ("apples", "books", "coins", "pencils", "cards", "marbles", "stickers", "cookies", "shells", "stamps")


def math_problem(rng: random.Random) -> tuple[str, int, str]:
    """One arithmetic word problem: ``(question, answer, worked solution)``."""
    a, b = rng.randint(1, 99), rng.randint(1, 99)
    kind = rng.randrange(4)
    if kind == 0:
        return f"What is {a} + {b}?", a + b, f"{a} + {b} = {a + b}. #### {a + b}"
    if kind == 1:
        a, b = max(a, b), min(a, b)
        return f"Compute {a} - {b}.", a - b, f"{a} - {b} = {a - b}. #### {a - b}"
    if kind == 2:
        b = rng.randint(2, 12)
        return f"What is {a} times {b}?", a * b, f"{a} * {b} = {a * b}. #### {a * b}"
    name, item, c = rng.choice(_NAMES), rng.choice(_ITEMS), rng.randint(1, 20)
    total = a + b - c
    return (
        f"{name} has {a} {item}. {name} buys {b} more and gives {c} away. How many {item} are left?",
        total,
        f"First {a} + {b} = {a + b} {item}, then {a + b} - {c} = {total}. #### {total}",
    )


def _training_text(n: int = 3000, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        question, _, solution = math_problem(rng)
        lines.append(f"{IM_START}user\n{question} {INSTRUCTION}{IM_END}\n{IM_START}assistant\n{solution}{IM_END}\n")
    return lines


def save_byte_level_bpe(corpus: list[str], chat_template: str, out: Path, added_tokens: tuple[str, ...] = ()) -> None:
    """Train a ByteLevel BPE of 1024 tokens on ``corpus`` and save it to ``out`` as a ``PreTrainedTokenizerFast``
    with Qwen's special tokens, ``chat_template`` and ``added_tokens`` (plain added tokens, as Qwen3's tool tags)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=1024,
        special_tokens=[ENDOFTEXT, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    if added_tokens:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in added_tokens])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        additional_special_tokens=[IM_START, IM_END],
        model_max_length=4096,
    )
    fast.chat_template = chat_template
    fast.save_pretrained(out)


def build_tokenizer(cache_dir: str | os.PathLike | None = None) -> Path:
    """ByteLevel BPE (~1k tokens) trained on synthetic math chat text, saved as a ``PreTrainedTokenizerFast``.

    Byte-level so any text encodes; ``<|endoftext|>`` is the pad token and ``<|im_end|>`` the eos, as in Qwen, and
    ``"\\n"`` is a single token (verl's Qwen Continuous Token builder requires it). Returns the tokenizer dir.
    """

    def build(out: Path) -> None:
        save_byte_level_bpe(_training_text(), CHAT_TEMPLATE, out)

    return _atomic_build(Path(cache_dir or default_cache_dir()) / TOKENIZER_VERSION, build, is_dir=True)


def build_tiny_qwen3_moe(cache_dir: str | os.PathLike | None = None, seed: int = 0) -> Path:
    """A randomly initialised (seeded) 4-layer, 8-expert Qwen3-MoE in float32, saved with its tokenizer; top-k routing
    weights renormalised (``norm_topk_prob``) as in Qwen3-30B-A3B, so Megatron and vLLM route alike.

    float32 because vLLM's CPU backend only runs eager mode in float32 on these machines (bf16 + eager crashes).
    The dir holds config.json, model.safetensors, generation_config.json and the tokenizer files: it is a complete
    model path for transformers, vLLM and verl (``actor_rollout_ref.model.path``). Returns the model dir.
    """
    root = Path(cache_dir or default_cache_dir())
    tok_dir = build_tokenizer(root)

    def build(out: Path) -> None:
        import torch
        from transformers import AutoTokenizer, GenerationConfig, Qwen3MoeConfig, Qwen3MoeForCausalLM

        tok = AutoTokenizer.from_pretrained(tok_dir)
        ids = dict(bos_token_id=tok.convert_tokens_to_ids(ENDOFTEXT), eos_token_id=tok.eos_token_id,
                   pad_token_id=tok.pad_token_id)
        config = Qwen3MoeConfig(
            hidden_size=128, intermediate_size=256, moe_intermediate_size=64, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_experts=8, num_experts_per_tok=2,
            vocab_size=len(tok), max_position_embeddings=4096, dtype="float32",
            # as Qwen3-30B-A3B: Megatron-Bridge always renormalises the top-k routing weights, HF and vLLM follow this
            norm_topk_prob=True, **ids,
        )
        torch.manual_seed(seed)
        model = Qwen3MoeForCausalLM(config).to(torch.float32)
        model.generation_config = GenerationConfig(**ids)
        model.save_pretrained(out, safe_serialization=True)
        tok.save_pretrained(out)

    return _atomic_build(root / f"{MODEL_VERSION}-s{seed}", build, is_dir=True)


def math_rows(n_rows: int, seed: int, split: str) -> list[dict]:
    """``n_rows`` arithmetic problems as verl RL rows (``data_source``, ``prompt``, ``ability``, ``reward_model``,
    ``extra_info``)."""
    rng = random.Random(f"{seed}-{split}")
    rows = []
    for i in range(n_rows):
        question, answer, _ = math_problem(rng)
        rows.append({
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(answer)},
            "extra_info": {"index": i, "split": split},
        })
    return rows


def build_rows_parquet(path: str | os.PathLike, make_rows: Callable[[], list[dict]]) -> Path:
    """Write ``make_rows()`` to ``path`` as parquet (kept if it already exists; atomic). Returns the path."""

    def build(out: Path) -> None:
        import pandas as pd

        pd.DataFrame(make_rows()).to_parquet(out, index=False)

    return _atomic_build(Path(path), build, is_dir=False)


def build_math_parquet(path: str | os.PathLike, n_rows: int, seed: int, split: str) -> Path:
    """Write ``math_rows(n_rows, seed, split)`` to ``path`` (kept if it already exists). Returns the path."""
    return build_rows_parquet(path, lambda: math_rows(n_rows, seed, split))


@dataclass(frozen=True)
class TinyArtifacts:
    model_dir: Path
    train_parquet: Path
    test_parquet: Path


def tiny_artifacts(cache_dir: str | os.PathLike | None = None, n_train: int = 96, n_test: int = 16,
                   seed: int = 0) -> TinyArtifacts:
    """Build (or reuse) the tiny model (with tokenizer) and the train/test parquet files."""
    root = Path(cache_dir or default_cache_dir())
    data = root / DATA_VERSION
    return TinyArtifacts(
        model_dir=build_tiny_qwen3_moe(root, seed=seed),
        train_parquet=build_math_parquet(data / f"train-n{n_train}-s{seed}.parquet", n_train, seed, "train"),
        test_parquet=build_math_parquet(data / f"test-n{n_test}-s{seed}.parquet", n_test, seed, "test"),
    )
