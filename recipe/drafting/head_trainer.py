"""Online draft learning: an EAGLE-3 head keeps training on the policy's own hidden states as RL moves the policy.

Each RL step the engines hand over what they captured while drafting (:mod:`recipe.drafting.head_capture`: per
request, its tokens and the target's aux hidden states), and :class:`OnlineHeadTrainer` first scores the head on
them (its top-1 draft of token t+2 against the token the policy sampled, over the responses' positions: the first
draft's acceptance at temperature 0, measured on data the head has not seen), then takes ``steps`` AdamW steps on
them: cross-entropy of the head's draft against the sampled token (an unbiased estimate of the cross-entropy to the
policy's distribution at the rollout's temperature). Only the first draft step is trained (EAGLE-3's training-time
test over later steps is not), and the loss covers response positions only; the prompt is context.

The LM head and embeddings the loss reads are the head's own where its checkpoint has them (a draft vocabulary:
``lm_head.weight`` with ``d2t``), else the target's from ``MODEL_PATH``, frozen: in the engines vLLM lends the head the
policy's current ones, which GRPO moves slowly; the trainer reads the initial model's (a difference the A/B run
measures, not hides). Frozen tensors are not pushed to the engines.

Where it trains: in the trainer's process, on its GPU if it has one, else on its CPU; the simulator
(``python -m recipe.sim.learned``) charges the time. Saved with the run's checkpoints (:meth:`save`, a loadable head
directory plus the optimizer) and resumed from them.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .eagle3_model import head_module

CONFIG, WEIGHTS, OPTIMIZER, STATE = "config.json", "model.safetensors", "optimizer.pt", "train_state.json"
SHARED = ("lm_head.weight", "embed_tokens.weight", "d2t", "t2d")  # read, never trained or pushed


def _load_safetensors(path: Path, names: tuple[str, ...] | None = None) -> dict:
    """Tensors of a checkpoint directory (``model.safetensors`` or its shards), all or only ``names``."""
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path} holds no .safetensors file")
    out = {}
    for f in files:
        with safe_open(str(f), "pt") as fh:
            for key in fh.keys():
                if names is None or key in names:
                    out[key] = fh.get_tensor(key)
    return out


def target_lm_tensors(model_path: str | Path) -> tuple:
    """The target's input embedding and LM head (tied models: the embedding twice), float32."""
    import torch

    model_path = Path(model_path)
    cfg = json.loads((model_path / CONFIG).read_text())
    names = ("model.embed_tokens.weight", "lm_head.weight")
    t = _load_safetensors(model_path, names)
    embed = t["model.embed_tokens.weight"].to(torch.float32)
    head = embed if cfg.get("tie_word_embeddings") or "lm_head.weight" not in t else t["lm_head.weight"]
    return embed, head.to(torch.float32)


class OnlineHeadTrainer:
    """The head at ``head_path`` for the target at ``model_path``, trained online (see the module docstring)."""

    def __init__(self, head_path: str | Path, model_path: str | Path, *, lr: float, steps: int,
                 batch_tokens: int = 4096, window: int = 4096, seed: int = 0, device: str | None = None):
        import torch

        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.head_path = Path(head_path)
        self.config = json.loads((self.head_path / CONFIG).read_text())
        state = _load_safetensors(self.head_path)
        self.head = head_module(self.config).to(self.device)
        trainable = {k: v for k, v in state.items() if k not in SHARED}
        missing, unexpected = self.head.load_state_dict(trainable, strict=False)
        missing = [k for k in missing if not k.startswith("rotary.")]
        if missing or unexpected:
            raise ValueError(f"{self.head_path}: not the one-layer EAGLE-3 Llama head the online trainer trains "
                             f"(missing {missing[:4]}, unexpected {unexpected[:4]})")
        embed, lm_head = target_lm_tensors(model_path)
        self.embed = state.get("embed_tokens.weight", embed).to(self.device, torch.float32)
        self.lm_head = state.get("lm_head.weight", lm_head).to(self.device, torch.float32)
        self.to_draft = None  # target token -> draft-vocabulary index (-1: not in it), for a draft vocabulary
        if "d2t" in state:
            d2t = state["d2t"].long()
            to_draft = torch.full((self.embed.shape[0],), -1, dtype=torch.long)
            to_draft[torch.arange(len(d2t)) + d2t] = torch.arange(len(d2t))
            self.to_draft = to_draft.to(self.device)
        self.steps, self.batch_tokens, self.window = int(steps), int(batch_tokens), int(window)
        self.opt = torch.optim.AdamW(self.head.parameters(), lr=lr, weight_decay=0.0)
        self.rng = np.random.default_rng(seed)
        self.trained_steps = 0  # optimizer steps over the run

    def state(self) -> dict[str, np.ndarray]:
        """What the engines get: the trained tensors under their checkpoint names, float32."""
        return {k: v.detach().to("cpu").float().numpy()
                for k, v in self.head.state_dict().items() if not k.startswith("rotary.")}

    def _examples(self, records: list[dict]):
        """(aux, embeds, labels, positions) per record, cropped to the last ``window`` positions that reach a
        response token; labels -100 off the response."""
        import torch

        for rec in records:
            tok = torch.as_tensor(rec["tokens"], dtype=torch.long)
            hid = torch.as_tensor(np.asarray(rec["hidden"], np.float32))
            n = len(tok) - 2  # positions t with a token t+2
            first = max(int(rec["prompt"]) - 1, 0)  # the first position whose t+2 is drafted
            if n <= first:
                continue
            start = max(0, n - self.window)
            t = torch.arange(start, n)
            labels = tok[t + 2].clone()
            labels[t < first] = -100
            if self.to_draft is not None:
                labels = torch.where(labels >= 0, self.to_draft.cpu()[labels.clamp(min=0)], labels)
                labels[labels < 0] = -100
            yield (hid[t].to(self.device), self.embed[tok[t + 1].to(self.device)], labels.to(self.device),
                   t.to(self.device))

    def _loss(self, ex):
        import torch

        aux, embeds, labels, pos = ex
        logits = self.head(aux[None], embeds[None], pos[None])[0] @ self.lm_head.T
        return torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100, reduction="sum"), logits

    def score(self, records: list[dict]) -> dict[str, float]:
        """The head's first-draft top-1 agreement and loss per token on ``records`` (no training)."""
        return self._score(self._examples(records))

    def _score(self, examples) -> dict[str, float]:
        import torch

        hits = total = 0
        loss = 0.0
        with torch.no_grad():
            for ex in examples:
                lsum, logits = self._loss(ex)
                mask = ex[2] >= 0
                hits += int((logits.argmax(-1)[mask] == ex[2][mask]).sum())
                total += int(mask.sum())
                loss += float(lsum)
        return {"tokens": float(total), "top1": hits / total if total else float("nan"),
                "loss": loss / total if total else float("nan")}

    def train(self, records: list[dict]) -> dict[str, float]:
        """Score on the step's records, then ``steps`` optimizer steps of about ``batch_tokens`` tokens each, drawn
        from them; returns ``draft_head/*`` metrics."""
        examples = list(self._examples(records))
        before = self._score(examples)
        sizes = np.array([int((ex[2] >= 0).sum()) for ex in examples])
        losses = []
        if examples and sizes.sum() > 0:
            self.head.train()
            for _ in range(self.steps):
                order = self.rng.permutation(len(examples))
                take = order[: max(1, int(np.searchsorted(np.cumsum(sizes[order]), self.batch_tokens) + 1))]
                self.opt.zero_grad()
                n = max(int(sizes[take].sum()), 1)
                total = sum(self._loss(examples[i])[0] for i in take) / n
                total.backward()
                self.opt.step()
                losses.append(float(total.detach()))
                self.trained_steps += 1
            self.head.eval()
        return {"draft_head/top1_before_train": before["top1"], "draft_head/loss_before_train": before["loss"],
                "draft_head/train_tokens": before["tokens"], "draft_head/train_records": float(len(examples)),
                "draft_head/train_loss_last": losses[-1] if losses else float("nan"),
                "draft_head/optimizer_steps": float(self.trained_steps)}

    def save(self, out: str | Path) -> Path:
        """A head directory vLLM loads (``config.json``, ``model.safetensors`` with the frozen tensors the head came
        with) plus the optimizer and the step count, for a resume."""
        import torch
        from safetensors.torch import save_file

        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        frozen = {k: v for k, v in _load_safetensors(self.head_path).items() if k in SHARED}
        state = {k: torch.as_tensor(v) for k, v in self.state().items()}
        save_file({**state, **{k: v.contiguous() for k, v in frozen.items()}}, str(out / WEIGHTS))
        (out / CONFIG).write_text(json.dumps(self.config, indent=2))
        torch.save(self.opt.state_dict(), out / OPTIMIZER)
        (out / STATE).write_text(json.dumps({"optimizer_steps": self.trained_steps,
                                             "rng": self.rng.bit_generator.state}))
        return out

    def load(self, src: str | Path) -> None:
        """Back to what :meth:`save` wrote (weights, optimizer, step count, batch sampler): training goes on as
        if never stopped."""
        import torch

        src = Path(src)
        state = {k: v for k, v in _load_safetensors(src).items() if k not in SHARED}
        self.head.load_state_dict({k: v.to(self.device) for k, v in state.items()}, strict=False)
        self.opt.load_state_dict(torch.load(src / OPTIMIZER, map_location=self.device, weights_only=True))
        saved = json.loads((src / STATE).read_text())
        self.trained_steps = int(saved["optimizer_steps"])
        self.rng.bit_generator.state = saved["rng"]
