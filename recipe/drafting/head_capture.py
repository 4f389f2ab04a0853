"""What an EAGLE-3 head learns from online: the target's own hidden states, taken inside vLLM as it drafts.

Where the hidden states come from, by cost: an ``eagle3`` engine already computes, at every step, the target's
hidden states at the head's three aux layers for every token it verifies, and hands them to its drafter
(``GPUModelRunner.propose_draft_token_ids`` -> ``EagleProposer.propose(target_token_ids, target_positions,
target_hidden_states, ..., common_attn_metadata, num_rejected_tokens_gpu)``, vLLM 0.24). Taking them there costs a
device-to-host copy of the captured tokens, no forward; the trainer's old-log-prob forward would need another
output through Megatron's pipeline stages and a copy of the same size. So each engine's output rank (the one whose
drafts the scheduler reads, :func:`recipe.drafting.vllm_proposer.drafts_reach_the_scheduler`) wraps its drafter's
``propose`` and keeps, per request, the positions, input tokens and aux hidden states of the tokens the step
verified: a request's segment of the batch (``query_start_loc_cpu``) less its rejected drafts (the last
``num_rejected_tokens_gpu`` entries in vLLM's padded drafter batch; without padding vLLM passes only the kept ones).
Over a request's life the positions it keeps are contiguous from 0 (prefill, then each step's verified tokens), so
a request's record is a sequence: hidden state at t, token t+1, token t+2, what the head is trained on
(:mod:`recipe.drafting.head_trainer`). A recomputed position (a preempted request) replaces the earlier one. A
record may run up to K tokens past its response's end: drafts the sampler accepted beyond ``max_tokens`` or a stop,
which the output drops; they are genuine samples of the target, so they train like the rest.

Bounded: at most ``max_tokens`` tokens per engine between two harvests (the trainer harvests every step); requests
are taken whole while room is left, so a record is a prefix of its request. While there is room each drafter call
reads the batch's positions, tokens and rejected counts from the device (a sync per engine step: the capture's cost,
with ``ROLLOUT_DRAFT_ONLINE`` only); once full, nothing. Stored as float16 (the aux layers of a
bf16 model stay far inside its range). ``harvest`` hands the records over and empties the store.

Runs inside vLLM's worker processes through ``collective_rpc`` (:mod:`recipe.adapter.draft_learning`); numpy only
crosses the RPC.
"""
from __future__ import annotations

import inspect

import numpy as np
import torch

ATTR = "_recipe_head_capture"


class HeadCapture:
    """One engine's store of verified tokens and their aux hidden states, per request, up to ``max_tokens``."""

    def __init__(self, max_tokens: int):
        self.max_tokens = int(max_tokens)
        self.records: dict[str, dict] = {}  # request id -> {"prompt": P, "pos": [...], "tok": [...], "hid": [...]}
        self.tokens = 0  # held now
        self.dropped = 0  # verified tokens not kept (no room) since the last harvest

    def add(self, req_ids, num_prompt, query_start, rejected, positions, tokens, hidden) -> None:
        """One drafter call: request ``i`` owns rows ``query_start[i]:query_start[i+1]`` of ``positions``,
        ``tokens`` (input ids) and ``hidden`` (aux hidden states), of which the last ``rejected[i]`` were drafts
        the step rejected."""
        keep_rows: list[np.ndarray] = []
        owners: list[tuple[str, int, int]] = []
        for i, rid in enumerate(req_ids):
            lo, hi = int(query_start[i]), int(query_start[i + 1]) - int(rejected[i])
            if hi <= lo:
                continue
            rec = self.records.get(rid)
            if rec is not None and rec["full"]:
                self.dropped += hi - lo
                continue
            if self.tokens + (hi - lo) > self.max_tokens:  # the request's record ends here: a prefix stays whole
                self.dropped += hi - lo
                if rec is not None:
                    rec["full"] = True
                continue
            if rec is None:
                rec = self.records[rid] = {"prompt": int(num_prompt[i]), "pos": [], "tok": [], "hid": [],
                                           "full": False}
            keep_rows.append(np.arange(lo, hi))
            owners.append((rid, lo, hi))
            self.tokens += hi - lo
        if not owners:
            return
        rows = np.concatenate(keep_rows)
        hid = hidden[torch.as_tensor(rows, device=hidden.device)].to("cpu", torch.float16).numpy()  # one copy
        pos, tok = positions[rows], tokens[rows]
        at = 0
        for rid, lo, hi in owners:
            n = hi - lo
            rec = self.records[rid]
            rec["pos"].append(pos[at:at + n])
            rec["tok"].append(tok[at:at + n])
            rec["hid"].append(hid[at:at + n])
            at += n

    def take(self) -> dict:
        """Everything held, and the store emptied: ``records``, each request's capture as one sequence contiguous
        from position 0 (``prompt``: its prompt length; ``tokens`` (L,); ``hidden`` (L, aux width) float16; a
        record not starting at 0 or shorter than three positions is left out); ``dropped``: verified tokens refused
        for lack of room; ``recaptured``: positions captured again (a recomputed request; the latest is kept)."""
        records, recaptured = [], 0
        for rec in self.records.values():
            if not rec["pos"]:
                continue
            pos = np.concatenate(rec["pos"])
            order = np.argsort(pos, kind="stable")
            pos = pos[order]
            last = np.r_[pos[1:] != pos[:-1], True]
            recaptured += int((~last).sum())
            pos, idx = pos[last], order[last]
            run = int(np.argmax(np.r_[pos != np.arange(len(pos)), True]))  # contiguous from 0
            if run < 3:
                continue
            idx = idx[:run]
            records.append({"prompt": rec["prompt"], "tokens": np.concatenate(rec["tok"])[idx].astype(np.int64),
                            "hidden": np.concatenate(rec["hid"])[idx]})
        out = {"records": records, "dropped": self.dropped, "recaptured": recaptured}
        self.records.clear()
        self.tokens = self.dropped = 0
        return out


def install(worker, max_tokens: int) -> bool:
    """Wrap the worker's EAGLE drafter's ``propose`` to feed a :class:`HeadCapture` (once; the bound is updated on
    a second call). True where this worker captures (the output rank of an eagle3 engine), else False."""
    from vllm.v1.spec_decode.eagle import EagleProposer

    from .vllm_proposer import drafts_reach_the_scheduler

    runner = worker.model_runner
    drafter = getattr(runner, "drafter", None)
    if not isinstance(drafter, EagleProposer):
        raise RuntimeError(f"draft learning needs vLLM's EAGLE proposer in the engine; this one drafts with "
                           f"{type(drafter).__name__} (ROLLOUT_SPECULATIVE=eagle3 and DRAFT_MODEL_PATH set it)")
    if not drafts_reach_the_scheduler():
        return False
    existing = getattr(drafter, ATTR, None)
    if existing is not None:
        existing.max_tokens = int(max_tokens)
        return True
    capture = HeadCapture(max_tokens)
    original = drafter.propose
    signature = inspect.signature(original)

    def propose(*args, **kwargs):
        _record(capture, runner.input_batch, signature.bind(*args, **kwargs).arguments)
        return original(*args, **kwargs)

    drafter.propose = propose
    setattr(drafter, ATTR, capture)
    return True


def _record(capture: HeadCapture, batch, a: dict) -> None:
    """One drafter call into ``capture``; once the store is full, nothing is read from the device (each read is a
    sync, which async scheduling would otherwise overlap) and the step's scheduled tokens count as dropped."""
    meta = a["common_attn_metadata"]
    n = meta.num_reqs
    if capture.tokens >= capture.max_tokens:
        capture.dropped += int(meta.query_start_loc_cpu[n])
        return
    rejected = a.get("num_rejected_tokens_gpu")
    rejected = np.zeros(n, np.int64) if rejected is None else rejected[:n].to("cpu").numpy()
    capture.add(batch.req_ids[:n], batch.num_prompt_tokens[:n], meta.query_start_loc_cpu[:n + 1].numpy(), rejected,
                a["target_positions"].to("cpu").numpy(), a["target_token_ids"].to("cpu").numpy(),
                a["target_hidden_states"])


def harvest(worker) -> dict:
    """The worker's :meth:`HeadCapture.take` (nothing where it does not capture), arrays as bytes: vLLM returns a
    ``collective_rpc`` result through msgpack without type information, where an array would come back as nested
    lists (:func:`unpack` restores them)."""
    capture = getattr(getattr(worker.model_runner, "drafter", None), ATTR, None)
    out = {"records": [], "dropped": 0, "recaptured": 0} if capture is None else capture.take()
    out["records"] = [{"prompt": r["prompt"], "tokens": r["tokens"].astype(np.int64).tobytes(),
                       "hidden": r["hidden"].tobytes(), "width": int(r["hidden"].shape[1])} for r in out["records"]]
    return out


def unpack(harvested: dict) -> dict:
    """:func:`harvest`'s result with its records' arrays back."""
    records = [{"prompt": int(r["prompt"]), "tokens": np.frombuffer(r["tokens"], np.int64),
                "hidden": np.frombuffer(r["hidden"], np.float16).reshape(-1, int(r["width"]))}
               for r in harvested["records"]]
    return {**harvested, "records": records}
