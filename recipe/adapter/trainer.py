"""``PPOTrainerSync`` subclass: the length-aware sampler, the per-batch cap, and the step metrics and traces.

Only small hook overrides, each pinned by tests/contract:
* ``_init_dataloader``: verl builds its dataloaders, then the train one is rebuilt with ``LengthAwareEpochSampler``
  (it runs before ``_load_checkpoint``, so a resume restores into this sampler).
* ``_next_train_batch``: every prompt fetched for training gets its length prediction, the batch's cap and the
  training step it is launched for (``rollout_step``) as row fields (validation batches never pass here, so they are
  never capped and never cut by the rollout gate).
* ``step``: after verl's step, read each response's row id, length, cap and prediction back from TransferQueue,
  update the estimates (before the checkpoint save in ``fit``), log the recipe metrics, append the length trace.
* ``_build_replay_buffer``: verl's replay buffer, polling TransferQueue every ``recipe.replay_buffer.poll_interval_s``
  instead of verl's 2 s: a sync step waits for the poll after its last group finishes (up to 2 s of idle replicas
  per step on the cluster; most of a step on a CPU) and an over-sampled step settles one poll after its B-th group.
* speculative decoding (``ROLLOUT_SPECULATIVE``): ``prepare_step`` and ``step`` read vLLM's acceptance counters
  from every replica; the difference is the step's ``rollout/spec_*`` metrics and its trace's ``spec``; around
  ``_validate``, ``val-aux/spec_*`` (``recipe/adapter/spec_metrics.py``).
* ``_compute_metrics``: after verl's, prints one compact progress line (``recipe/adapter/progress.py``).
* tail cut (``recipe.tail_cut.enable``): ``on_sample_begin`` starts watching the step, which is cut once enough of
  it is done; ``on_sample_end`` stops the watch, ``on_step_end`` re-opens generation (``recipe/adapter/tail_cut.py``).
* over-sampling (``recipe.over_sample.enable``): ``prepare_step`` launches the extra prompts, ``on_sample_end``
  aborts and re-queues the groups that lost the race before the replicas sleep, ``on_step_end`` resumes generation
  after the weight update (see ``recipe/adapter/oversample.py``).
* both abort through one ``StepAbort`` (``recipe/adapter/step_abort.py``): close the rollout gate for the step,
  abort the replicas, settle, and after the weight update resume generation and open the gate.
* multi-turn (``actor_rollout_ref.rollout.multi_turn.enable``): with over-sampling or the tail cut, a rollout gate
  (``recipe/adapter/rollout_gate.py``) closed for the aborted step before the abort, so the agent loops cancel that
  step's tool calls in flight; ``step`` reads each trajectory's turns, tool calls, tool tokens and tool time into
  the traces and ``rollout/tools/*`` (``recipe/adapter/turns.py``), and the tool calls and time into the sampler,
  whose time key orders epochs with ``data.sampler.order_by=time``.
* token records (``recipe.record_tokens.enable``): ``step`` also writes each trained response's prompt and response
  ids (``recipe/token_record.py``) and logs ``record_tokens/*``.
* ``ROLLOUT_SPECULATIVE=eagle3`` (``recipe/adapter/draft_learning.py``): ``on_init_end`` and ``on_step_end`` push the
  head to every engine after verl's weight sync and check it there; online, ``on_sample_end`` harvests the engines'
  captures and starts training, ``step`` joins it; ``_save_checkpoint`` / ``_load_checkpoint`` save and resume it.
* routing replay (R3, ``recipe/adapter/routes.py``): ``step`` logs the trained tokens masked for lack of routes
  (``rollout/routes/unrouted_masked_tokens``); the over-sampler empties the routes of the records it keeps for a
  resume; ``rollout/mismatch/*`` leaves out a resumed response's stale tokens (an older policy's log-probs).
"""
from __future__ import annotations

import logging
import os
import sys

import numpy as np
import torch
import transfer_queue as tq
from omegaconf import OmegaConf, open_dict
from torchdata.stateful_dataloader import StatefulDataLoader
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils import tensordict_utils as tu
from verl.utils.dataset.rl_dataset import collate_fn

from ..core.cap import make_cap_policy
from ..core.mismatch import mismatch_metrics
from ..core.oversample import OverSampleController
from ..core.seeds import row_seeds
from ..core.tailcut import TailCut, batch_level
from ..core.tailcut_budget import TailCutBudget
from ..core.step_stats import StepResponses, step_metrics
from ..settings import parse_settings
from ..token_record import TokenRecorder
from ..traces import LengthTraceWriter, finish_reasons
from .columns import column_to_numpy, sequences
from .draft_learning import DraftLearning, eagle3_head
from .fields import CAP, PARTIAL, PREDICTION, PRIORITY, ROLLOUT_STEP, ROW_ID, SEED
from .oversample import OverSampleDriver
from .partial import STALE
from .progress import progress_line
from .routes import replay_on, route_shape, routes_metrics
from .rollout_gate import create_gate
from .sampler import LengthAwareEpochSampler
from .spec_metrics import SpecAcceptanceMeter, trace_fields
from .step_abort import StepAbort
from .tail_cut import TailCutMonitor
from .turns import tool_observations, trajectory_turns, turn_metrics
from .warm_start import WarmStartReport, warm_start

logger = logging.getLogger(__name__)

CAP_STATE_KEY = "cap_policy"
RESUMED_PRIORITY = -(2**30)  # ahead of any predicted length
OVER_SAMPLE_STATE_KEY = "over_sample"
MISALIGNED = "rollout/mismatch/misaligned_records"  # records left out of rollout/mismatch/* (should stay 0)
STALE_EXCLUDED = "rollout/mismatch/stale_tokens_excluded"  # trained tokens of an older policy left out of it
TAIL_CUT_STATE_KEY = "tail_cut_budget"  # the truncation budget's controller (recipe.core.tailcut_budget)


class LengthAwareTrainer(PPOTrainerSync):
    def __init__(self, config):
        self.settings = parse_settings(OmegaConf.to_container(config, resolve=True))
        super().__init__(config)
        cap = self.settings.cap
        self.cap_policy = (
            make_cap_policy(cap.mode, self.settings.response_length, **cap.policy_kwargs()) if cap.enabled else None
        )
        self.length_sampler: LengthAwareEpochSampler | None = None
        run_dir = config.trainer.default_local_dir
        self.trace_writer = None
        if self.settings.traces.enabled:
            self.trace_writer = LengthTraceWriter(
                self.settings.traces.path or os.path.join(run_dir, "length_traces.jsonl"))
        rec = self.settings.record_tokens
        self.token_recorder = (TokenRecorder(rec.path or os.path.join(run_dir, "tokens"), rec.max_bytes)
                               if rec.enabled else None)
        self.over_sample: OverSampleDriver | None = None  # built with the dataloader (needs the tokenizer)
        self.warm_start: WarmStartReport | None = None
        tc = self.settings.tail_cut
        budget = (TailCutBudget(tc.max_extra_truncation, tc.level_exponent, initial_allowance=1.0 - tc.fraction)
                  if tc.max_extra_truncation > 0 else None)
        # multi-turn runs that abort mid-step tell their agent loops through the rollout gate (tools are cancelled)
        multi_turn = bool(config.actor_rollout_ref.rollout.get("multi_turn", {}).get("enable", False))
        self.multi_turn = multi_turn
        self.rollout_gate = create_gate() if multi_turn and (tc.enabled or self.settings.over_sample.enabled) else None
        self.step_abort = StepAbort(self.rollout_gate)  # the one abort sequence of the tail cut and over-sampling
        self.tail_cut = (TailCutMonitor(TailCut(tc.fraction, tc.level_exponent), config.actor_rollout_ref.rollout.n,
                                        budget=budget, abort=self.step_abort) if tc.enabled else None)
        self._launch: tuple[list[str], float, int] | None = None  # the last batch formed: uids, length level, step
        self.priority_scheduling = config.actor_rollout_ref.rollout.get("scheduling_policy", "fcfs") == "priority"
        # speculative decoding's acceptance per step, from vLLM's counters (recipe/adapter/spec_metrics.py)
        vllm_kwargs = (config.actor_rollout_ref.rollout.get("engine_kwargs") or {}).get("vllm") or {}
        self.spec_meter = (SpecAcceptanceMeter(lambda: self.llm_server_manager.server_addresses)
                           if vllm_kwargs.get("speculative_config") else None)
        self._spec_step: dict = {}
        head = eagle3_head(config)
        if self.settings.draft_head.online and head is None:
            from ..settings import RecipeConfigError

            raise RecipeConfigError("recipe.draft_head.online (ROLLOUT_DRAFT_ONLINE=1) trains an EAGLE-3 head: it "
                                    "needs ROLLOUT_SPECULATIVE=eagle3 and DRAFT_MODEL_PATH")
        self.draft = (DraftLearning(self.settings.draft_head, head, config.actor_rollout_ref.model.path)
                      if head is not None else None)

    def _build_replay_buffer(self):
        buffer = super()._build_replay_buffer()
        buffer.poll_interval = self.settings.poll_interval_s
        return buffer

    def _compute_old_log_prob(self, batch, metrics):
        """verl's, then the step's training-inference mismatch on the trained tokens (``rollout/mismatch/*``,
        ``recipe.core.mismatch``) where the rollout returned its log-probs: what router replay is meant to shrink."""
        batch = super()._compute_old_log_prob(batch, metrics)
        if self.config.actor_rollout_ref.rollout.get("calculate_log_probs", False):
            metrics.update(self.mismatch(batch))
        return batch

    def mismatch(self, batch) -> dict[str, float]:
        """``mismatch_metrics`` of the batch's records in TransferQueue (trainer's ``old_log_probs`` against the
        rollout's ``rollout_log_probs`` where ``response_mask`` is set), without a resumed response's stale tokens
        (``extra_fields[STALE]``, over-sample ``continue``: an older policy generated them, so their gap measures the
        policy's move, not the rollout engine's; counted in ``STALE_EXCLUDED``). In bypass mode verl sets the first
        to the second, so the figures are zero there by construction."""
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                               select_fields=["old_log_probs", "rollout_log_probs", "response_mask", "extra_fields"])
        stale = [int(e.get(STALE, 0)) if isinstance(e, dict) else 0 for e in list(data["extra_fields"])]
        rows = [(t.float().numpy(), r.float().numpy(), m.numpy() * (np.arange(len(m)) >= n), int(m[:n].sum()))
                for t, r, m, n in zip(sequences(data["old_log_probs"]), sequences(data["rollout_log_probs"]),
                                      sequences(data["response_mask"]), stale)]
        aligned = [row for row in rows if len(row[0]) == len(row[1]) == len(row[2])]
        out = {} if not aligned else mismatch_metrics(*(np.concatenate(col) for col in list(zip(*aligned))[:3]))
        if any(row[3] for row in aligned):
            out[STALE_EXCLUDED] = float(sum(row[3] for row in aligned))
        if len(aligned) < len(rows):  # a record whose log-probs do not line up with its tokens: say so, never guess
            logger.warning("mismatch: %d of %d records have log-probs of another length than their mask",
                           len(rows) - len(aligned), len(rows))
            out[MISALIGNED] = float(len(rows) - len(aligned))
        return out

    def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
        super()._compute_metrics(batch, metrics, timing_raw, global_steps, epoch)
        # stderr: wandb's console capture swallows the actor's stdout once it starts, and Ray forwards stderr too
        print(progress_line(global_steps, self.total_training_steps, metrics), file=sys.stderr, flush=True)

    # -- dataloader ------------------------------------------------------------------------------------------------
    def _init_dataloader(self):
        super()._init_dataloader()
        if not self.settings.sampler.enabled:
            return
        self.length_sampler = LengthAwareEpochSampler.from_settings(self.train_dataset, self.settings)
        self.warm_start = warm_start(self.length_sampler.estimates, self.cap_policy, self.train_dataset, self.settings,
                                     self.length_sampler.time_key)
        if self.warm_start is not None:
            print(f"[recipe] {self.warm_start.line(self.length_sampler.num_rows)}", file=sys.stderr, flush=True)
        os_cfg = self.settings.over_sample
        if os_cfg.enabled:
            rollout = self.config.actor_rollout_ref.rollout
            self.over_sample = OverSampleDriver(
                OverSampleController(self.settings.train_batch_size, os_cfg.ratio, os_cfg.requeue, os_cfg.max_resumes),
                rollout_n=rollout.n,
                stop_token_ids=stop_token_ids(self.tokenizer),
                response_length=self.settings.response_length,
                has_logprobs=bool(rollout.get("calculate_log_probs", False)),
                events_path=(os.path.join(self.config.trainer.default_local_dir, "over_sample_events.jsonl")
                             if os_cfg.abort_events else None),
                abort=self.step_abort,
                multi_turn=self.multi_turn,
                route_shape=route_shape(self.config.actor_rollout_ref.model.path) if replay_on(self.config) else None,
            )
            # Over-sampled steps launch any number of prompts: fetch one row per dataloader batch (verl does the
            # same for its exact refills).
            with open_dict(self.config):
                self.config.data.gen_batch_size = 1
        gen_batch_size = self.config.data.get("gen_batch_size", None) or self.config.data.train_batch_size
        if self.over_sample is None and gen_batch_size != self.settings.batch_size:
            raise ValueError(
                f"verl fetches {gen_batch_size} prompts per dataloader batch but the sampler was built for "
                f"{self.settings.batch_size} (data.gen_batch_size was overridden: DAPO filter_groups or "
                "sync_refill_failed_groups are not supported with the length-aware sampler)"
            )
        self.train_dataloader = StatefulDataLoader(
            dataset=self.train_dataset,
            batch_size=gen_batch_size,
            num_workers=0,
            drop_last=True,
            collate_fn=collate_fn,
            sampler=self.length_sampler,
        )

    # -- per-batch cap ---------------------------------------------------------------------------------------------
    def _restore_driver_state(self) -> None:
        """After a resume torchdata applies the sampler state at the first batch fetch; the cap policy and the
        over-sample accounting saved with it are restored from there."""
        if self.length_sampler is None:
            return
        restored = self.length_sampler.consume_restored_extra_state()
        if restored and self.cap_policy is not None and CAP_STATE_KEY in restored:
            self.cap_policy.load_state_dict(restored[CAP_STATE_KEY])
        if restored and self.over_sample is not None and OVER_SAMPLE_STATE_KEY in restored:
            self.over_sample.load_state_dict(restored[OVER_SAMPLE_STATE_KEY])
        if restored and self.tail_cut is not None and TAIL_CUT_STATE_KEY in restored:
            self.tail_cut.load_state_dict(restored[TAIL_CUT_STATE_KEY])

    def batch_prediction_and_cap(self, rows: np.ndarray) -> tuple[np.ndarray, int]:
        """Length predictions of the batch's rows (NaN where unseen) and the cap for the batch (0 = none)."""
        if self.length_sampler is None:
            return np.full(len(rows), np.nan), 0
        pred = self.length_sampler.estimates.get(rows, fill_prior=False)
        cap = self.cap_policy.cap_for_batch(pred) if self.cap_policy is not None else None
        return pred, int(cap or 0)

    def _next_train_batch(self, num_prompts=None):
        batch = super()._next_train_batch(num_prompts)
        self._restore_driver_state()
        rows = column_to_numpy(batch[ROW_ID], dtype=np.int64)
        pred, cap = self.batch_prediction_and_cap(rows)
        batch[PREDICTION] = torch.as_tensor(pred, dtype=torch.float32)
        batch[CAP] = torch.full((len(rows),), cap, dtype=torch.int64)
        # the step this batch is launched for: an abort closes the rollout gate for it, and only for it
        step = int(self.global_steps)
        batch[ROLLOUT_STEP] = torch.full((len(rows),), step, dtype=torch.int64)
        if self.settings.sampling_seed is not None:
            batch[SEED] = torch.as_tensor(row_seeds(self.settings.sampling_seed, self._fetch_epoch(), rows))
        if self.over_sample is not None and self.over_sample.controller.requeue == "continue":
            tu.assign_non_tensor_stack(batch, PARTIAL, self.over_sample.partial_for(rows))
        if self.tail_cut is not None:
            self._launch = ([str(u) for u in batch["uid"]], self._batch_level(pred), step)
        if self.priority_scheduling:
            priorities = self.row_priorities(rows)
            batch[PRIORITY] = torch.as_tensor(priorities, dtype=torch.int64)
            # Dispatched in priority order too: verl's agent-loop worker sends a batch's requests row by row, and
            # the first to arrive fill vLLM's free slots before the later ones are even waiting to be ordered.
            batch = batch[torch.as_tensor(np.argsort(priorities, kind="stable"))]
        return batch

    def _batch_level(self, pred: np.ndarray) -> float:
        """The batch's mean estimate over all known rows' mean (1.0 without estimates): the tail cut's level."""
        if self.length_sampler is None:
            return 1.0
        return batch_level(pred, self.length_sampler.estimates.get(np.arange(self.length_sampler.num_rows),
                                                                  fill_prior=False))

    def row_priorities(self, rows: np.ndarray) -> np.ndarray:
        """vLLM priorities (lower runs first) with ``rollout.scheduling_policy=priority``: longest predicted first,
        so a step's long responses start before its short ones instead of queueing behind them; groups resumed from
        their partial responses (over-sample ``continue``) before everything. Strictly on-policy (it only orders).
        The batch is also dispatched in this order (``_next_train_batch``)."""
        if self.length_sampler is None:
            return np.zeros(len(rows), np.int64)
        pred = self.length_sampler.estimates.get(rows, fill_prior=True)
        pri = -np.nan_to_num(pred, nan=0.0).round().astype(np.int64)
        if self.over_sample is not None:
            resumed = np.array([r in self.over_sample.partials for r in rows.tolist()], bool)
            pri[resumed] = RESUMED_PRIORITY
        return pri

    def _fetch_epoch(self) -> int:
        """The epoch the rows just fetched belong to."""
        if self.length_sampler is not None:
            return self.length_sampler.plan.epoch
        return (self.global_steps - 1) // max(self.steps_per_epoch, 1)

    # -- over-sampling ----------------------------------------------------------------------------------------------
    def prepare_step(self) -> dict:
        if getattr(self, "spec_meter", None) is not None:
            self.spec_meter.begin()  # before anything of this step is generated (over-sampling launches here)
        if self.over_sample is None:
            return super().prepare_step()
        self.over_sample.launch(self)
        return {}

    def on_sample_begin(self):
        super().on_sample_begin()
        if self.tail_cut is not None and self._launch is not None:
            uids, level, step = self._launch
            self.tail_cut.start(self.checkpoint_manager, uids, level, step=step)

    def on_init_end(self):
        super().on_init_end()  # verl's first weight sync
        if self.draft is not None:
            self.draft.start(self.checkpoint_manager)

    def on_sample_end(self):
        if self.draft is not None:  # the engines' captures, before the replicas sleep
            self.draft.after_rollout(self.checkpoint_manager)
        if self.over_sample is not None:
            self.over_sample.settle(self)
            self.length_sampler.extra_state[OVER_SAMPLE_STATE_KEY] = self.over_sample.state_dict()
        if self.tail_cut is not None and self._launch is not None:
            self.tail_cut.stop(len(self._launch[0]) * self.config.actor_rollout_ref.rollout.n)
        super().on_sample_end()

    def on_step_end(self):
        super().on_step_end()
        if self.draft is not None:  # after the weight sync, which a level-2 sleep makes lose the head
            self.draft.push(self.checkpoint_manager)
        if self.over_sample is not None:
            self.over_sample.resume(self)
        if self.tail_cut is not None:
            self.tail_cut.resume(self.checkpoint_manager)

    def _save_checkpoint(self):
        if self.draft is not None:  # before verl's tracker file names this step as the latest checkpoint
            self.draft.save(os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}"))
        super()._save_checkpoint()

    def _load_checkpoint(self):
        out = super()._load_checkpoint()
        if self.draft is not None and self.global_steps > 0:  # the folder verl resumed from
            t = self.config.trainer
            folder = (t.resume_from_path if t.resume_mode == "resume_path"
                      else os.path.join(t.default_local_dir, f"global_step_{self.global_steps}"))
            self.draft.load(os.path.abspath(folder))
        return out

    def _validate(self):
        meter = getattr(self, "spec_meter", None)
        return super()._validate() if meter is None else meter.around(super()._validate)

    # -- after each step -------------------------------------------------------------------------------------------
    def step(self, metrics, timing_raw):
        batch = super().step(metrics, timing_raw)
        meter = getattr(self, "spec_meter", None)
        self._spec_step = meter.end() if meter is not None else {}
        metrics.update(self._spec_step)
        if self.draft is not None:  # the head trained beside the actor update
            self.draft.finish_training()
            metrics.update(self.draft.step_metrics())
        metrics.update(self.observe_batch(batch, gen_time_s=float(timing_raw.get("gen", 0.0))))
        if self.over_sample is not None:
            metrics.update(self.over_sample.last_metrics)
        if self.tail_cut is not None:
            metrics.update(self.tail_cut.last_metrics)
        return batch

    def observe_batch(self, batch, gen_time_s: float) -> dict:
        """Read the step's trained responses back from TransferQueue (padding rows skipped) and observe them.

        A response's length is its token count (``response_len``, the tag verl's AgentLoopWorkerTQ writes), not the
        sum of its ``response_mask``: ``mask_stale_tokens`` zeroes the mask of a resumed response's older tokens,
        which would record it short and uncensored."""
        real = [(k, tag) for k, tag in zip(batch.keys, batch.tags) if not tag.get("is_padding", False)]
        if not real:
            return {}
        keys = [k for k, _ in real]
        turn_fields = ["num_turns", "response_mask", "extra_fields"] if getattr(self, "multi_turn", False) else []
        routes = replay_on(self.config)  # R3: the trained tokens that left the loss for lack of routes
        route_fields = ["extra_fields"] if routes and not turn_fields else []
        recorder = getattr(self, "token_recorder", None)
        token_fields = ["prompts", "responses"] if recorder is not None else []
        data = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id,
                               select_fields=[ROW_ID, CAP, PREDICTION, "metrics"] + turn_fields + route_fields
                               + token_fields)
        resp = StepResponses(
            rows=column_to_numpy(data[ROW_ID], dtype=np.int64),
            lengths=np.array([int(tag["response_len"]) for _, tag in real], dtype=np.int64),
            caps=column_to_numpy(data[CAP], dtype=np.int64),
            predicted=column_to_numpy(data[PREDICTION], dtype=np.float64),
            response_length=self.settings.response_length,
            sample_index=[int(k.rsplit("_", 2)[1]) for k in keys],  # keys are {uid}_{session}_{turn}
            num_preempted=preemptions(data),
            # stopped by the tail cut: lower bounds, like a cap hit (StepResponses.censored)
            aborted=self._cut_mask(keys),
        )
        aborted = self.over_sample.last_aborted if self.over_sample is not None else None
        turns = trajectory_turns(data, resp.lengths) if turn_fields else None
        metrics = self.observe(resp, gen_time_s=gen_time_s, aborted=aborted, turns=turns)
        if routes:
            metrics.update(routes_metrics(list(data["extra_fields"])))
        if recorder is not None:
            # verl stores each record's prompt and response unpadded (AgentLoopWorkerTQ); a multi-turn response holds
            # its tool outputs too, recorded as they are (the acceptance estimator then drafts over them as well)
            metrics.update(recorder.record(int(self.global_steps), int(metrics["sampler/epoch"]), resp.rows,
                                           resp.sample_index, sequences(data["prompts"]),
                                           sequences(data["responses"])))
        return metrics

    def _cut_mask(self, keys: list[str]) -> np.ndarray | None:
        """Per trained response: stopped by this step's tail cut (None when the step was not cut)."""
        done = self.tail_cut.done_at_cut if self.tail_cut is not None else None
        return None if done is None else np.array([k not in done for k in keys], bool)

    def observe(self, resp: StepResponses, gen_time_s: float, aborted: StepResponses | None = None,
                turns: dict | None = None) -> dict:
        """Update estimates and cap calibration from one step's trained responses; return the step's recipe metrics.
        ``aborted`` (the over-sampler's aborted partial responses, already folded into the estimates as censored
        observations) only joins the step's length trace, as ``abort`` entries. ``turns`` (multi-turn runs:
        :func:`trajectory_turns` of the trained responses) joins the trace and the step's ``rollout/tools/*``, and
        its tool calls and tool seconds the sampler's time key (single-turn steps: no calls)."""
        obs = None
        epoch = (self.global_steps - 1) // max(self.steps_per_epoch, 1)
        if self.length_sampler is not None:
            calls, tool_s = tool_observations(turns, len(resp.rows))
            obs = self.length_sampler.update(resp.rows, resp.lengths, resp.censored(), tool_calls=calls,
                                             tool_s=tool_s)
            epoch = self.length_sampler.plan.epoch
            if self.cap_policy is not None:
                self.cap_policy.observe_step(epoch, resp)
                self.length_sampler.extra_state[CAP_STATE_KEY] = self.cap_policy.state_dict()
        if self.tail_cut is not None and self.tail_cut.budget is not None:
            self.tail_cut.observe(resp)  # the truncation budget's controller: the next step's allowance
            if self.length_sampler is not None:
                self.length_sampler.extra_state[TAIL_CUT_STATE_KEY] = self.tail_cut.state_dict()
        m = step_metrics(resp, obs)
        m["sampler/epoch"] = float(epoch)
        if self.length_sampler is not None:
            m["sampler/seen_ratio"] = self.length_sampler.estimates.seen_ratio()
            m["sampler/known_ratio"] = self.length_sampler.estimates.known_ratio()
            if self.length_sampler.time_key is not None:
                m["sampler/mean_tool_latency_s"] = self.length_sampler.time_key.mean_latency_s()
        if self.warm_start is not None:
            m["sampler/warm_started_rows"] = float(self.warm_start.rows)
        if turns is not None:
            m.update(turn_metrics(turns))
        if self.trace_writer is not None:
            self._append_trace(int(epoch), resp, aborted, gen_time_s, turns)
        return m

    def _append_trace(self, epoch: int, resp: StepResponses, aborted: StepResponses | None, gen_time_s: float,
                      turns: dict | None = None):
        parts = [resp] + ([aborted] if aborted is not None and len(aborted.rows) else [])
        cat = lambda name: np.concatenate([getattr(p, name) for p in parts])  # noqa: E731
        samples = [p.sample_index if p.sample_index is not None else _sample_index(p.rows) for p in parts]
        keys = self.train_dataset.prompt_keys()
        preempted = [p.num_preempted if p.num_preempted is not None else np.full(len(p.rows), -1) for p in parts]
        cap = int(resp.caps.max()) or None
        # a trained response is "aborted" only when the tail cut stopped it (over-sample aborts are never trained)
        finish = finish_reasons(resp.lengths, cap, resp.response_length, resp.aborted, stopped_as="cut")
        if len(parts) > 1:
            finish += finish_reasons(aborted.lengths, cap, aborted.response_length, aborted.aborted)
        self.trace_writer.append(
            finish=finish,
            prompt_keys=[keys[r] for r in cat("rows").tolist()],
            num_preempted=np.concatenate(preempted).tolist() if resp.num_preempted is not None else None,
            epoch=epoch,
            step=int(self.global_steps),
            cap=cap,
            response_length=self.settings.response_length,
            gen_time_s=gen_time_s,
            rows=cat("rows").tolist(),
            sample_index=np.concatenate(samples).tolist(),
            lengths=cat("lengths").astype(int).tolist(),
            predicted=[None if not np.isfinite(p) else float(p) for p in cat("predicted")],
            spec=trace_fields(getattr(self, "_spec_step", {})),
            # the over-sampler's aborted entries (after the trained ones) have no turn counts
            turns=None if turns is None else {k: list(v) + [None] * (len(finish) - len(v)) for k, v in turns.items()},
        )


def preemptions(data) -> np.ndarray | None:
    """vLLM's preemptions of each trajectory's request (verl's per-sample ``metrics.num_preempted``; -1 where the
    rollout does not report it), or None when the records carry no metrics at all."""
    if "metrics" not in data.keys():
        return None
    values = [m.get("num_preempted") if isinstance(m, dict) else None for m in list(data["metrics"])]
    return np.array([-1 if v is None else int(v) for v in values], np.int64)


def stop_token_ids(tokenizer) -> set[int]:
    """Token ids that end a response (a partial response ending in one is complete, nothing to resume)."""
    ids = {tokenizer.eos_token_id}
    for token in ("<|im_end|>", "<|endoftext|>"):
        tid = tokenizer.convert_tokens_to_ids(token)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id:
            ids.add(tid)
    return {i for i in ids if i is not None}


def _sample_index(rows: np.ndarray) -> list[int]:
    """0..n-1 within each row's group, in order of appearance."""
    seen: dict[int, int] = {}
    out = []
    for r in rows.tolist():
        out.append(seen.get(r, 0))
        seen[r] = out[-1] + 1
    return out
