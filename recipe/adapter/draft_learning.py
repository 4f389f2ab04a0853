"""The ``eagle3`` head in the RL loop: kept in every engine, and with ``recipe.draft_head.online`` trained each step.

Why the head is pushed at all, even frozen: verl 0.9.1 sleeps its colocated vLLM replicas after each rollout at
level 2 (``vLLMHttpServer._resolve_sleep_level``: level 1 only for MTP, LoRA adapters or NPUs), which discards every
weight the engine loaded under vLLM's "weights" memory tag, the EAGLE head's included (``gpu_worker.load_model``
loads target and drafter under one tag), and the weight sync that follows restores the policy's tensors only. From
the second step on the head would draft from whatever the re-mapped memory holds: exact (vLLM verifies every draft)
and silently slow. So after every weight sync (``on_step_end``) and at start-up (``on_init_end``), the trainer's
head goes to every replica and each engine's copy is checked equal to it (``recipe.drafting.head_sync``), or the
run stops naming the replica and tensor. (Read from vLLM 0.24's and verl 0.9.1's source; the CPU platform does not
sleep, so the CPU runs show the push and the check, not the loss.)

Online (``ROLLOUT_DRAFT_ONLINE=1``): each engine captures the target's aux hidden states as it drafts
(:mod:`recipe.drafting.head_capture`, at most ``capture_tokens`` per engine and step); after the rollout
(``on_sample_end``, before the replicas sleep) the trainer harvests them, then scores the head on them (the step's
``draft_head/top1_before_train``: measured on data it has not trained on) and trains it
(:class:`recipe.drafting.head_trainer.OnlineHeadTrainer`) in a thread while the actor computes log-probs and
updates (the trainer's process only waits on Ray then); the step joins it after the update, and the push after the
weight sync carries the new head. Saved in each
checkpoint as ``global_step_N/draft_head`` (a head directory vLLM loads, plus its optimizer) before verl writes the
checkpoint's tracker, and resumed from there.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import time
from pathlib import Path

from ..drafting.head_capture import unpack
from ..drafting.head_trainer import OnlineHeadTrainer
from .engine_rpc import call_engines, replica_servers

logger = logging.getLogger(__name__)

CHECKPOINT_DIR = "draft_head"


def eagle3_head(config) -> str | None:
    """The head's path when the rollout drafts with ``eagle3``, else None."""
    vllm = (config.actor_rollout_ref.rollout.get("engine_kwargs") or {}).get("vllm") or {}
    spec = vllm.get("speculative_config") or {}
    return str(spec["model"]) if spec.get("method") == "eagle3" else None


class DraftLearning:
    """Keeps the run's head in every engine; trains it online when asked (see the module docstring)."""

    def __init__(self, settings, head_path: str, model_path: str):
        self.settings = settings
        self.trainer = OnlineHeadTrainer(head_path, model_path, lr=settings.lr, steps=settings.train_steps,
                                         batch_tokens=settings.batch_tokens)
        self.last_metrics: dict[str, float] = {}  # the step's (finish_training)
        self._training: _Training | None = None
        self.push_s = float("nan")  # the last push and check, in seconds

    def start(self, checkpoint_manager) -> None:
        """At start-up (after a resume's load): capture on where online, then the head into every engine."""
        servers = replica_servers(checkpoint_manager)
        if self.settings.online:
            capturing = [any(r) for r in call_engines(servers, "recipe_head_capture_install", self.settings.capture_tokens)]
            if not all(capturing):
                raise RuntimeError(f"draft learning: replicas {[i for i, c in enumerate(capturing) if not c]} have "
                                   "no worker that captures (no output rank with an EAGLE drafter)")
        self.push(checkpoint_manager)

    def after_rollout(self, checkpoint_manager) -> None:
        """Harvest the step's captures (online only) and start training on them in a thread: the trainer's process
        only waits on Ray while the actor computes log-probs and updates, so the head trains in that time."""
        if not self.settings.online:
            return
        t0 = time.monotonic()
        harvested = [unpack(w) for per_server in call_engines(replica_servers(checkpoint_manager),
                                                              "recipe_head_capture_harvest") for w in per_server]
        # in an order of their own, not the requests' arrival: a resumed run trains the head as the first run did
        records = sorted((rec for w in harvested for rec in w["records"]), key=lambda r: r["tokens"].tobytes())
        metrics = {"draft_head/capture_dropped_tokens": float(sum(w["dropped"] for w in harvested)),
                   "draft_head/capture_recaptured_tokens": float(sum(w["recaptured"] for w in harvested)),
                   "draft_head/harvest_s": time.monotonic() - t0}
        self._training = _Training(self.trainer, records, metrics)

    def finish_training(self) -> None:
        """Wait for the step's training (after the actor update); its metrics become the step's. A failure in it
        is raised here."""
        training, self._training = self._training, None
        if training is not None:
            self.last_metrics = training.join()

    def push(self, checkpoint_manager) -> None:
        """The trainer's head into every engine, checked equal there (raises naming what differs)."""
        from ..drafting.head_sync import push_head

        self.finish_training()
        t0 = time.monotonic()
        servers = replica_servers(checkpoint_manager)
        if not servers:
            raise RuntimeError("draft head: verl's checkpoint manager lists no rollout replica to push the head to "
                               "(checkpoint_manager.replicas is empty): the engines would draft with a stale head")
        problems = push_head(servers, self.trainer.state(), self.trainer.config)
        if problems:
            raise RuntimeError("draft head sync: the engines' heads differ from the trainer's after the push: "
                               + "; ".join(problems[:8]))
        self.push_s = time.monotonic() - t0

    def step_metrics(self) -> dict[str, float]:
        """The step's training metrics and the previous push's seconds (pushed after the step's weight sync)."""
        return {**self.last_metrics, "draft_head/push_s": self.push_s}

    def save(self, step_dir: str | os.PathLike) -> None:
        self.finish_training()
        self.trainer.save(Path(step_dir) / CHECKPOINT_DIR)

    def load(self, step_dir: str | os.PathLike) -> bool:
        """Resume the head saved in ``step_dir``; False (and a notice) where that checkpoint has none."""
        src = Path(step_dir) / CHECKPOINT_DIR
        if not src.is_dir():
            print(f"[recipe] draft head: {step_dir} has no {CHECKPOINT_DIR}/ (saved without eagle3); the head "
                  f"starts again from {self.trainer.head_path}", file=sys.stderr, flush=True)
            return False
        self.trainer.load(src)
        print(f"[recipe] draft head resumed from {src} ({self.trainer.trained_steps} optimizer steps)",
              file=sys.stderr, flush=True)
        return True


class _Training:
    """One step's head training in a thread; ``join`` returns its metrics or raises what it raised."""

    def __init__(self, trainer: OnlineHeadTrainer, records: list[dict], metrics: dict[str, float]):
        self.metrics, self.error = metrics, None
        self.thread = threading.Thread(target=self._run, args=(trainer, records), name="draft-head-training",
                                       daemon=True)
        self.thread.start()

    def _run(self, trainer, records) -> None:
        t0 = time.monotonic()
        try:
            self.metrics.update(trainer.train(records))
        except BaseException as e:  # re-raised in the trainer's thread by join
            self.error = e
        self.metrics["draft_head/train_s"] = time.monotonic() - t0

    def join(self) -> dict[str, float]:
        self.thread.join()
        if self.error is not None:
            raise RuntimeError("draft head: online training failed") from self.error
        return self.metrics
