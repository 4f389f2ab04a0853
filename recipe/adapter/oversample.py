"""Over-sample then abort on verl 0.9.1's v1 sync trainer (driver side).

Per step (``LengthAwareTrainer`` calls these from verl's hooks):
* ``launch`` (from ``prepare_step``): fetch ``ceil(B * (1 + ratio))`` prompts through the dataloader (one row per
  fetch, so any count works) and submit them; verl's ``ReplayBuffer.sample`` then returns as soon as ``B`` groups
  are complete with all n responses.
* ``settle`` (from ``on_sample_end``, before the replicas sleep, as verl's colocate-async trainer does): abort every
  request on every replica (``abort_replicas(reject_request=True)`` so late submissions fail fast instead of parking
  until the next resume), wait until the leftover groups are terminal in TransferQueue, count what vLLM still holds
  (``engine_unfinished_after_settle``, 0 after a clean abort), read their partial lengths
  (censored observations for the estimates, and ``abort`` entries of the step's length trace), drop them from
  TransferQueue and re-queue their prompts into the epoch. The abort, the settle's deadline and the resume are
  ``recipe.adapter.step_abort.StepAbort``'s (shared with the tail cut): on multi-turn runs the rollout gate closes
  first for the launch's step (``recipe.adapter.rollout_gate``), so its tool calls in flight are cancelled and the
  settle never waits on a tool. ``resume`` (from ``on_step_end``, after the weight update) re-opens generation (and
  the gate).
* ``continue`` mode: an aborted group's trajectories stay in TransferQueue and its row carries a ``PartialRef`` the
  next time it is launched (``partial_for``); its agent loops resume each response (recipe/adapter/partial.py;
  multi-turn trajectories from the turn-boundary snapshot an abort leaves in them, recipe/adapter/tool_agent_loop.py).
  The old trajectories are cleared once the resumed launch has settled. Partial responses are driver memory only:
  after a checkpoint resume their rows (still re-queued) regenerate from scratch. With routing replay (R3) their
  routes are not kept (the resume routes them anew, ``recipe.adapter.routes``): the kept records' ``routed_experts``
  is overwritten with an empty array at the settle, so none are held in TransferQueue across the step.
Validation never passes through these hooks (it uses the "val" partition and its own dispatch).
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import transfer_queue as tq
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

from ..core.oversample import OverSampleController, StepOutcome, requeue_aborted
from ..core.step_stats import StepResponses
from .columns import column_to_numpy, sequences
from .fields import CAP, PREDICTION, ROLLOUT_STEP, ROW_ID
from .partial import RESUME_AT, PartialRef
from .step_abort import StepAbort

logger = logging.getLogger(__name__)

TERMINAL = ("finished", "failure")


@dataclass
class Launch:
    uids: list[str]
    rows: np.ndarray
    time: float
    epoch: int
    step: int  # the training step the rows carry (``rollout_step``): the one the gate closes for
    partition_id: str = "train"
    extra: dict = field(default_factory=dict)


class OverSampleDriver:
    def __init__(self, controller: OverSampleController, *, rollout_n: int, stop_token_ids: set[int],
                 response_length: int, has_logprobs: bool, settle_timeout_s: float = 600.0,
                 events_path: str | None = None, poll_s: float = 0.05, abort: StepAbort | None = None,
                 multi_turn: bool = False, route_shape: tuple[int, int] | None = None):
        self.controller = controller
        self.rollout_n = int(rollout_n)
        self.stop_token_ids = set(stop_token_ids)
        self.response_length = int(response_length)
        self.has_logprobs = bool(has_logprobs)
        self.settle_timeout_s = settle_timeout_s
        self.events_path = events_path
        self.poll_s = poll_s
        self.abort = abort if abort is not None else StepAbort()  # the trainer's (it holds the rollout gate)
        self.multi_turn = bool(multi_turn)  # trajectories say themselves whether an abort cut them (RESUME_AT)
        self.route_shape = route_shape  # R3: (layers, top_k) of the routes the records carry (None: no routes)
        self.pending: Launch | None = None
        self.partials: dict[int, PartialRef] = {}  # row -> where its partial responses wait (continue mode)
        self.last_metrics: dict[str, float] = {}
        self.last_aborted: StepResponses | None = None  # the last settle's aborted responses (for the traces)
        self.last_partial_tokens: dict[tuple[str, int], tuple[list[int], list[int]]] = {}  # (uid, session) -> ids

    def partial_for(self, rows) -> list[str]:
        """Row field values for a batch being launched: the rows' partial-response descriptors ("" = none)."""
        return [self.partials[r].to_json() if r in self.partials else "" for r in np.asarray(rows).tolist()]

    def launch(self, trainer) -> int:
        sampler = trainer.length_sampler
        if trainer.train_dataloader_it is None:
            # After a checkpoint load torchdata applies the sampler state only when the dataloader is iterated:
            # create verl's iterator now (verl's _fetch_one_gen_batch reuses it) so the launch is sized on the
            # restored epoch, not on a fresh one.
            trainer.train_dataloader_it = iter(trainer.train_dataloader)
        count = self.controller.launch_count(sampler.plan.num_remaining())
        batch = trainer._next_train_batch(count)
        uids = [str(u) for u in batch["uid"]]
        rows = column_to_numpy(batch[ROW_ID], dtype=np.int64)
        resumed = {r: self.partials.pop(r) for r in rows.tolist() if r in self.partials}
        self.pending = Launch(uids=uids, rows=rows, time=time.time(), epoch=sampler.plan.epoch,
                              step=int(batch[ROLLOUT_STEP][0]),
                              extra={"resumed": resumed, "caps": column_to_numpy(batch[CAP], dtype=np.int64)})
        return trainer._submit_batch_to_rollout(batch)

    def _leftover(self, launch: Launch) -> dict[str, str]:
        """Launched prompt uids still registered in TransferQueue (the replay buffer removes the ones it trains)."""
        items = (tq.kv_list(launch.partition_id) or {}).get(launch.partition_id, {})
        wanted = set(launch.uids)
        return {k: t.get("status") for k, t in items.items() if t.get("is_prompt", False) and k in wanted}

    def settle(self, trainer) -> dict[str, float]:
        """Abort the groups that lost the race, record them, clear them and re-queue their prompts."""
        launch, self.pending = self.pending, None
        self.last_aborted, self.last_partial_tokens = None, {}
        if launch is None:
            return {}
        t_target = time.time()
        leftover = self._leftover(launch)
        if leftover:
            self.abort.abort(trainer.checkpoint_manager, launch.step)

            def stuck() -> list[str]:
                leftover.update(self._leftover(launch))
                return [u for u, s in leftover.items() if s not in TERMINAL]

            self.abort.settle(stuck, self.settle_timeout_s, self.poll_s, "over-sample")
        idle_s = time.time() - t_target
        unfinished = engine_unfinished_requests(trainer.checkpoint_manager) if leftover else 0
        if unfinished:
            logger.warning("over-sample: %d requests still unfinished on the rollout replicas after the abort settled",
                           unfinished)
        aborted_tokens, kept_tokens = self._observe_and_clear(trainer, launch, set(leftover)) if leftover else (0, 0)
        self._clear_resumed_sources(launch)
        kept = np.array([u not in leftover for u in launch.uids])
        outcome = StepOutcome(launched=launch.rows, kept=kept, aborted_tokens=aborted_tokens)
        requeue_aborted(self.controller, trainer.length_sampler.plan, outcome.requeued,
                        [r in self.partials for r in outcome.requeued.tolist()])
        self.controller.record(launch.epoch, outcome)
        if self.events_path and leftover:
            self._write_events(trainer, launch, leftover, t_target)
        self.last_metrics = {
            **outcome.metrics(),
            "rollout/over_sample/target_to_idle_s": idle_s,
            "rollout/over_sample/engine_unfinished_after_settle": float(unfinished),
            "rollout/over_sample/resumed_groups": float(len(launch.extra["resumed"])),
            "rollout/over_sample/kept_partial_tokens": float(kept_tokens),
            "rollout/over_sample/discarded_tokens": float(aborted_tokens - kept_tokens),
        }
        return self.last_metrics

    def _observe_and_clear(self, trainer, launch: Launch, leftover: set[str]) -> tuple[int, int]:
        """Censored estimate updates from the aborted groups; keep (continue) or drop (restart) their responses.
        Returns (tokens the aborted groups had generated, tokens kept for resumption)."""
        items = (tq.kv_list(launch.partition_id) or {}).get(launch.partition_id, {})
        traj = sorted(k for k, t in items.items()
                      if not t.get("is_prompt", False) and k.split("_", 1)[0] in leftover)
        tokens = kept_tokens = 0
        keep_uids: set[str] = set()
        if traj:
            fields = ([ROW_ID, "responses", CAP, PREDICTION] + (["prompts"] if self.events_path else [])
                      + (["extra_fields"] if self.multi_turn else []))
            data = tq.kv_batch_get(keys=traj, partition_id=launch.partition_id, select_fields=fields)
            responses = [r.tolist() for r in sequences(data["responses"])]
            if self.events_path:
                self.last_partial_tokens = {
                    (k.rsplit("_", 2)[0], int(k.rsplit("_", 2)[1])): (r, p.tolist())
                    for k, r, p in zip(traj, responses, sequences(data["prompts"]))}
            rows = column_to_numpy(data[ROW_ID], dtype=np.int64)
            # token counts, not response_mask sums (mask_stale_tokens zeroes a resumed response's older tokens)
            lengths = np.array([int(items[k]["response_len"]) for k in traj], dtype=np.int64)
            tokens = int(lengths.sum())
            # a response of an aborted group that had already stopped (EOS) is complete: an exact length, traced
            # as eos; the others were cut by the abort (a multi-turn one may end in EOS and still be cut: a
            # tool-call turn whose tool was cancelled)
            cut = np.array([not (r and r[-1] in self.stop_token_ids) for r in responses], dtype=bool)
            if self.multi_turn:
                cut |= np.array([RESUME_AT in e for e in sequences(data["extra_fields"])], dtype=bool)
            self.last_aborted = StepResponses(
                rows=rows, lengths=lengths, caps=column_to_numpy(data[CAP], dtype=np.int64),
                predicted=column_to_numpy(data[PREDICTION], dtype=np.float64), response_length=self.response_length,
                aborted=cut, sample_index=[int(k.rsplit("_", 2)[1]) for k in traj])
            # partial lengths are lower bounds: they may raise an estimate, never lower it
            trainer.length_sampler.update(rows, lengths, censored=self.last_aborted.censored())
            if self.controller.requeue == "continue":
                keep_uids = self._keep_partials(launch, traj, items, responses, cut)
                kept_tokens = int(sum(n for k, n in zip(traj, lengths.tolist()) if k.split("_", 1)[0] in keep_uids))
                self._drop_routes([k for k in traj if k.split("_", 1)[0] in keep_uids], launch.partition_id)
        drop = [k for k in traj if k.split("_", 1)[0] not in keep_uids]
        tq.kv_clear(keys=sorted(leftover) + drop, partition_id=launch.partition_id)
        return tokens, kept_tokens

    def _keep_partials(self, launch: Launch, traj: list[str], items: dict, responses, cut: np.ndarray) -> set[str]:
        """Register a ``PartialRef`` for each aborted group allowed another resume; returns their uids."""
        row_of = dict(zip(launch.uids, launch.rows.tolist()))
        cap_of = dict(zip(launch.uids, launch.extra["caps"].tolist()))
        by_uid: dict[str, dict[int, tuple[list[int], bool, int]]] = {}
        for key, seq, was_cut in zip(traj, responses, cut.tolist()):
            uid, session, _ = key.rsplit("_", 2)
            version = items[key].get("min_global_steps")
            by_uid.setdefault(uid, {})[int(session)] = (seq, was_cut, version)
        kept = set()
        for uid, sessions in by_uid.items():
            row = row_of[uid]
            previous = launch.extra["resumed"].get(row)
            resumes = previous.resumes if previous is not None else 0
            if len(sessions) != self.rollout_n or not self.controller.keeps_partial(resumes):
                continue
            limit = cap_of[uid] if 0 < cap_of[uid] < self.response_length else self.response_length
            # done: stopped by EOS before the abort (``cut`` False), or at this launch's limit
            complete = [bool(tok) and (not was_cut or len(tok) >= limit)
                        for tok, was_cut, _ in (sessions[s] for s in range(self.rollout_n))]
            versions = [v for _, _, v in sessions.values() if v is not None]
            self.partials[row] = PartialRef(
                key_prefix=uid, partition_id=launch.partition_id, complete=complete,
                min_version=int(min(versions)) if versions else 0, resumes=resumes + 1,
                has_logprobs=self.has_logprobs)
            kept.add(uid)
        return kept

    def _drop_routes(self, keys: list[str], partition_id: str) -> None:
        """R3: the kept records' routes, which nothing reads (a resume re-prefills or regenerates what it trains),
        replaced by arrays of no rows: up to (prompt + response) x layers x top-k x 2 bytes each, held no longer."""
        if self.route_shape is None or not keys:
            return
        empty = {"routed_experts": torch.zeros((0, *self.route_shape), dtype=torch.int16)}
        tq.kv_batch_put(keys=keys, partition_id=partition_id, fields=list_of_dict_to_tensordict([empty] * len(keys)))

    def _clear_resumed_sources(self, launch: Launch) -> None:
        """The resumed groups' old trajectories have been read by their agent loops: drop them."""
        keys = [ref.key(s) for ref in launch.extra["resumed"].values() for s in range(self.rollout_n)]
        if keys:
            tq.kv_clear(keys=keys, partition_id=launch.partition_id)

    def _write_events(self, trainer, launch: Launch, leftover: dict[str, str], t_abort: float) -> None:
        """One JSON line per aborted group: when it was launched and aborted, whether its partial responses wait for
        a resume, and each session's partial response (token count and text) as the abort left it."""
        row_of = dict(zip(launch.uids, launch.rows.tolist()))
        by_uid: dict[str, list] = {}
        prompts: dict[str, str] = {}
        for (uid, session), (tokens, prompt) in self.last_partial_tokens.items():
            by_uid.setdefault(uid, []).append({"session": session, "tokens": len(tokens),
                                               "text": trainer.tokenizer.decode(tokens, skip_special_tokens=True)})
            prompts[uid] = trainer.tokenizer.decode(prompt, skip_special_tokens=True)
        os.makedirs(os.path.dirname(self.events_path) or ".", exist_ok=True)
        with open(self.events_path, "a") as f:
            for uid in sorted(leftover):
                row = row_of[uid]
                f.write(json.dumps({
                    "uid": uid, "dataset_item_idx": row, "epoch": launch.epoch, "step": int(trainer.global_steps),
                    "launched_at": launch.time, "aborted_at": t_abort, "duration_s": t_abort - launch.time,
                    "resumes_next": row in self.partials and self.partials[row].key_prefix == uid,
                    "prompt": prompts.get(uid), "sessions": sorted(by_uid.get(uid, []), key=lambda e: e["session"]),
                }) + "\n")

    def resume(self, trainer) -> None:
        self.abort.resume(trainer.checkpoint_manager)

    def state_dict(self) -> dict:
        return self.controller.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.controller.load_state_dict(state)


def _engine_request_count(server) -> int:
    """Requests vLLM's frontend still tracks on this server (runs inside verl's vLLMHttpServer actor; verl reads
    the same ``output_processor.request_states`` when it aborts). Only node rank 0 of a replica owns the engine."""
    engine = getattr(server, "engine", None)
    return len(engine.output_processor.request_states) if engine is not None else 0


def engine_unfinished_requests(checkpoint_manager) -> int:
    """Requests left on all rollout replicas; 0 after a clean abort. (0 too where the manager has no replicas.)"""
    import ray

    servers = [r.servers[0] for r in getattr(checkpoint_manager, "replicas", None) or [] if getattr(r, "servers", None)]
    if not servers:
        return 0
    return int(sum(ray.get([s.__ray_call__.remote(_engine_request_count) for s in servers])))
