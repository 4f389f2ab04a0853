"""Per-response length traces: one JSON line per training step, for offline analysis of the sampler and the cap.

verl's own file logger only keeps per-step aggregates (and truncates its file on resume), while tuning the
length-aware sampler and the response cap needs every response's length, finish reason and prediction. The writer
is append-only and fsyncs each record, so the file survives crashes and resumes; a resumed run that redoes step k
appends a second record for k, and ``load_traces`` keeps the last one.

Pure Python (pandas is imported lazily by ``load_traces``): no verl import, so the trainer, the simulator and the
report can all use it.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

FINISH_REASONS = ("eos", "length", "cap", "cut", "abort")
# stopped before their end and trained that way: the length limit, the cap, or the tail cut (recipe/core/tailcut.py)
TRUNCATED = frozenset({"length", "cap", "cut"})
TRACE_COLUMNS = (
    "epoch",
    "step",
    "dataset_item_idx",
    "sample_index",
    "response_length",
    "finish_reason",
    "cap",
    "max_response_length",
    "predicted_length",
    "gen_time_s",
)


def finish_reasons(
    lengths: Sequence[int], cap: int | None, response_length: int, aborted: Sequence[bool] | None = None,
    stopped_as: str = "abort",
) -> list[str]:
    """Why each response stopped, inferred from its length.

    Precedence (first match wins), so that a length limit that was actually reached is always reported as such:

    1. ``"cap"``: ``length >= cap`` and the cap is binding (``cap < response_length``; a cap at or above the
       configured length changes nothing, so such responses count as ``"length"``);
    2. ``"length"``: ``length >= response_length``;
    3. ``"abort"``: ``aborted[i]`` (the over-sampler cancelled it before EOS or a limit; its length is a lower bound);
    4. ``"eos"``.

    ``stopped_as`` names rule 3's reason: ``"cut"`` for responses the tail cut stopped (trained, not re-queued).

    Like verl's ``response_length/clip_ratio``, a response that emitted EOS exactly at the limit counts as truncated:
    the token ids alone cannot tell the two apart.
    """
    if aborted is not None and len(aborted) != len(lengths):
        raise ValueError(f"aborted has {len(aborted)} entries for {len(lengths)} lengths")
    binding_cap = cap if cap is not None and cap < response_length else None
    reasons = []
    for i, n in enumerate(lengths):
        if binding_cap is not None and n >= binding_cap:
            reasons.append("cap")
        elif n >= response_length:
            reasons.append("length")
        elif aborted is not None and aborted[i]:
            reasons.append(stopped_as)
        else:
            reasons.append("eos")
    return reasons


def prompt_key(messages) -> str:
    """A content key of a prompt (its messages as the train file holds them), recorded with every response, so that
    an earlier run's traces can warm-start a run on a re-cut or re-ordered file of the same prompts."""
    blob = json.dumps(messages, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def _finite_or_none(x) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


class LengthTraceWriter:
    """Appends one trace record per training step to a JSONL file (``"a"`` mode, flush + fsync per record).

    Opening in append mode is what makes traces survive a resume (verl's file logger opens its file with ``"wb"``).
    If a crash left a partial last line, a newline is written first so that line, not the next record, is the one
    ``load_traces`` skips.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fp = open(self.path, "a+b")
        if self._fp.seek(0, os.SEEK_END) > 0:
            self._fp.seek(-1, os.SEEK_END)
            if self._fp.read(1) != b"\n":
                self._fp.write(b"\n")

    def append(
        self,
        *,
        epoch: int,
        step: int,
        cap: int | None,
        response_length: int,
        gen_time_s: float | None,
        rows: Sequence[int],
        sample_index: Sequence[int],
        lengths: Sequence[int],
        predicted: Sequence[float | None] | None = None,
        finish: Sequence[str] | None = None,
        aborted: Sequence[bool] | None = None,
        prompt_keys: Sequence[str] | None = None,
        num_preempted: Sequence[int | None] | None = None,
        spec: dict | None = None,
        turns: dict[str, Sequence] | None = None,
    ) -> dict:
        """Write and fsync the record for one step; returns it.

        ``finish`` defaults to ``finish_reasons(lengths, cap, response_length, aborted)``; pass it explicitly when
        the rollout reports real stop reasons. ``predicted`` (the sampler's estimate per response, NaN/None when
        unknown) is stored with nulls for missing values. A ``cap`` of None or 0 means no cap. ``prompt_keys``
        (``prompt_key`` of each response's prompt) and ``num_preempted`` (vLLM's preemptions of each response's
        request, None where the rollout does not report it) are stored when given. ``spec`` (speculative decoding's
        step totals: drafts, draft_tokens, accepted_tokens, acceptance_length; vLLM 0.24 has no per-request
        acceptance) is stored as the record's ``spec`` when given. ``turns`` (multi-turn runs) holds per-response lists
        ``num_turns`` (messages, verl's count), ``tool_calls``, ``tool_tokens`` (the response's tokens with mask 0: tool
        replies and turn markers) and ``tool_s`` (tool wall time), None where unknown (over-sample aborts); each
        becomes a per-response list of the record.
        """
        n = len(lengths)
        if finish is None:
            finish = finish_reasons(lengths, cap or None, response_length, aborted)
        if predicted is None:
            predicted = [None] * n
        per_response = {"rows": rows, "sample_index": sample_index, "finish": finish, "predicted": predicted}
        if prompt_keys is not None:
            per_response["prompt_keys"] = prompt_keys
        if num_preempted is not None:
            per_response["num_preempted"] = num_preempted
        per_response.update(turns or {})
        for name, values in per_response.items():
            if len(values) != n:
                raise ValueError(f"{name} has {len(values)} entries for {n} lengths (one per response expected)")
        bad = sorted({f for f in finish if f not in FINISH_REASONS})
        if bad:
            raise ValueError(f"unknown finish reasons {bad}; expected one of {FINISH_REASONS}")
        record = {
            "epoch": int(epoch),
            "step": int(step),
            "cap": int(cap) if cap else None,
            "response_length": int(response_length),
            "gen_time_s": _finite_or_none(gen_time_s),
            "rows": [int(r) for r in rows],
            "sample_index": [int(s) for s in sample_index],
            "lengths": [int(x) for x in lengths],
            "finish": [str(f) for f in finish],
            "predicted": [_finite_or_none(p) for p in predicted],
            "time": time.time(),
        }
        if prompt_keys is not None:
            record["prompt_keys"] = [str(k) for k in prompt_keys]
        if spec is not None:
            record["spec"] = dict(spec)
        if num_preempted is not None:
            record["num_preempted"] = [None if p is None or p < 0 else int(p) for p in num_preempted]
        for name, values in (turns or {}).items():
            record[name] = [None if v is None else (round(float(v), 4) if name == "tool_s" else int(v))
                            for v in values]
        self._fp.write(json.dumps(record, separators=(",", ":")).encode() + b"\n")
        self._fp.flush()
        os.fsync(self._fp.fileno())
        return record

    def close(self) -> None:
        self._fp.close()

    def __enter__(self) -> LengthTraceWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def is_trace_record(obj) -> bool:
    """Whether a parsed JSON line looks like a ``LengthTraceWriter`` record (used to find trace files by shape)."""
    return isinstance(obj, dict) and "step" in obj and isinstance(obj.get("lengths"), list)


def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, object]]:
    """(line number, parsed object) per non-empty line; ``None`` for a line that does not parse (a crash can leave
    a partial last line). Shared by the trace and run-log readers."""
    with open(path, encoding="utf-8") as fp:
        for lineno, line in enumerate(fp, 1):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError:
                yield lineno, None


def read_records(paths: str | os.PathLike | Iterable[str | os.PathLike]) -> dict[int, dict]:
    """Last record per step over ``paths`` (later lines and later files win); unparseable lines are skipped with
    a warning."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    by_step: dict[int, dict] = {}
    for path in paths:
        for lineno, rec in iter_jsonl(path):
            if rec is None:
                warnings.warn(f"{path}:{lineno}: skipped unparseable trace line", stacklevel=2)
            elif not is_trace_record(rec):
                warnings.warn(f"{path}:{lineno}: skipped line that is not a length-trace record", stacklevel=2)
            else:
                by_step[int(rec["step"])] = rec
    return dict(sorted(by_step.items()))


def load_traces(paths: str | os.PathLike | Iterable[str | os.PathLike]):
    """Traces as a pandas DataFrame with one row per response (columns ``TRACE_COLUMNS``), sorted by step.

    Only the last record of each step is kept, so a resumed run that redid step k contributes k once.
    ``response_length`` is the response's length in tokens and ``max_response_length`` the configured limit;
    ``cap`` is a nullable integer (NA when off) and ``predicted_length`` a float (NaN when unknown).
    """
    import pandas as pd

    columns: dict[str, list] = {c: [] for c in TRACE_COLUMNS}
    for step, rec in read_records(paths).items():
        n = len(rec["lengths"])
        columns["epoch"] += [rec.get("epoch")] * n
        columns["step"] += [step] * n
        columns["dataset_item_idx"] += rec.get("rows") or [None] * n
        columns["sample_index"] += rec.get("sample_index") or [None] * n
        columns["response_length"] += rec["lengths"]
        columns["finish_reason"] += rec.get("finish") or [None] * n
        columns["cap"] += [rec.get("cap")] * n
        columns["max_response_length"] += [rec.get("response_length")] * n
        columns["predicted_length"] += [float("nan") if p is None else p for p in rec.get("predicted") or [None] * n]
        columns["gen_time_s"] += [rec.get("gen_time_s")] * n
    df = pd.DataFrame(columns)
    dtypes = {
        "epoch": "Int64",
        "step": "int64",
        "dataset_item_idx": "Int64",
        "sample_index": "Int64",
        "response_length": "int64",
        "finish_reason": "object",
        "cap": "Int64",
        "max_response_length": "Int64",
        "predicted_length": "float64",
        "gen_time_s": "float64",
    }
    return df.astype(dtypes)
