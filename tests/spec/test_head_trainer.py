"""The online head trainer (``recipe/drafting/head_trainer.py``) on the tiny model's own hidden states, without an
engine: records built as the engines' captures are (tokens from position 0, the aux hidden states, float16).

- Learning: a head whose trained weights were shuffled (drafts nothing right) trained on 160 of the model's texts
  recovers most of the trained head's top-1 agreement on 32 texts it never saw.
- Resume: saved and loaded, training goes on bit for bit as if never stopped (weights, AdamW moments, batch draws).
- Loss and score cover response positions only: a record whose response is a single token scores nothing.
"""
import json

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def texts(tiny_artifacts):
    """192 of the tiny model's texts (16-token random prompts, 40 sampled tokens at temperature 0.03) as records."""
    from transformers import AutoModelForCausalLM

    from recipe.tiny.eagle3_head import AUX_LAYERS

    model = AutoModelForCausalLM.from_pretrained(tiny_artifacts.model_dir, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(3)
    prompts = torch.randint(3, model.config.vocab_size, (192, 16), generator=g)
    torch.manual_seed(3)
    with torch.no_grad():
        seqs = model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=True, temperature=0.03,
                              top_k=0, max_new_tokens=40, min_new_tokens=40, pad_token_id=0)
        hs = model(seqs, output_hidden_states=True).hidden_states
    aux = torch.cat([hs[i] for i in AUX_LAYERS], dim=-1).to(torch.float16).numpy()
    return [{"prompt": 16, "tokens": s.numpy(), "hidden": a} for s, a in zip(seqs, aux)]


@pytest.fixture(scope="module")
def heads(tiny_artifacts, tmp_path_factory):
    """The tiny trained head, and the same with each tensor's values shuffled (seeded)."""
    from safetensors.numpy import load_file, save_file

    from recipe.tiny.eagle3_head import build_tiny_eagle3_head

    trained = build_tiny_eagle3_head(tiny_artifacts.model_dir)
    shuffled = tmp_path_factory.mktemp("shuffled-head")
    rng = np.random.default_rng(0)
    state = {n: rng.permutation(a.ravel()).reshape(a.shape) for n, a in load_file(trained / "model.safetensors").items()}
    save_file(state, str(shuffled / "model.safetensors"))
    (shuffled / "config.json").write_text((trained / "config.json").read_text())
    return trained, shuffled


def _trainer(head, tiny_artifacts, **kw):
    from recipe.drafting.head_trainer import OnlineHeadTrainer

    return OnlineHeadTrainer(head, tiny_artifacts.model_dir, lr=kw.pop("lr", 3e-3), steps=kw.pop("steps", 10),
                             batch_tokens=kw.pop("batch_tokens", 256), device="cpu", **kw)


def test_training_on_captures_recovers_a_scrambled_head(texts, heads, tiny_artifacts):
    trained, shuffled = heads
    train, held = texts[:160], texts[160:]
    reference = _trainer(trained, tiny_artifacts).score(held)["top1"]
    t = _trainer(shuffled, tiny_artifacts)
    before = t.score(held)["top1"]
    metrics = [t.train(train) for _ in range(30)]  # 30 RL steps of 10 optimizer steps on the same captures
    after = t.score(held)["top1"]
    print(f"held-out top-1: trained head {reference:.3f}; shuffled {before:.3f} -> {after:.3f} after 300 steps "
          f"(loss {metrics[0]['draft_head/loss_before_train']:.2f} -> {metrics[-1]['draft_head/train_loss_last']:.2f})")
    assert before < 0.2 * reference and after > 0.6 * reference, (before, after, reference)
    assert metrics[-1]["draft_head/optimizer_steps"] == 300 and metrics[0]["draft_head/train_tokens"] == 160 * 39


def test_resume_continues_bit_for_bit(texts, heads, tiny_artifacts, tmp_path):
    _, shuffled = heads
    a = _trainer(shuffled, tiny_artifacts, steps=3)
    a.train(texts[:16])
    a.save(tmp_path / "ckpt")
    b = _trainer(shuffled, tiny_artifacts, steps=3)
    b.load(tmp_path / "ckpt")
    assert json.loads((tmp_path / "ckpt" / "train_state.json").read_text())["optimizer_steps"] == 3
    a.train(texts[16:32])
    b.train(texts[16:32])
    for name, x in a.state().items():
        assert np.array_equal(x, b.state()[name]), name


def test_only_response_positions_count(texts, heads, tiny_artifacts):
    t = _trainer(heads[0], tiny_artifacts)
    rec = dict(texts[0])
    assert t.score([rec])["tokens"] == 40 - 1  # positions 15..53 draft tokens 17..55: the responses' but the first
    rec["prompt"] = len(rec["tokens"]) - 1  # the response is the last token: nothing is drafted in it
    assert t.score([rec])["tokens"] == 0
