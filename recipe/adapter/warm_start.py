"""Warm start (``data.sampler.init_from``, ``data.sampler.prior_column``): length estimates before the first step.

With nothing observed, the sampler's first epoch is random and uncapped, and on a real dataset the first epoch is
most of the run. An earlier run on the same prompts knows their lengths: its ``length_traces.jsonl`` records each
response with its prompt's content key (``recipe.traces.prompt_key``), so the rows of this train file are matched by
content, whatever order or cut the file has now. Its first epoch seeds the estimates (the earlier run started from
the same policy as this one, so its first epoch is the best prediction of this one's, as the simulator measures:
bench/RESULTS.md), censored entries (cut by a cap or the length limit, or aborted) as lower bounds; all its epochs
calibrate a learning cap. Rows it does not know keep the population prior. A parquet column of expected lengths
(``prior_column``, e.g. measured offline) gives per-row priors instead or as well. Either makes epoch 0
length-ordered and capped like any later epoch. With ``order_by=time`` the traces' per-response ``tool_calls`` and
``tool_s`` (multi-turn runs) seed the time key's tool-call estimates and mean tool latency the same way; traces
without them leave both empty. On a resume the checkpoint's estimates replace all of this.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ..core.cap import warm_start_cap
from ..traces import TRUNCATED, read_records


class WarmStartError(ValueError):
    """The warm-start source cannot seed this run; the message names the key and the fix."""


@dataclass(frozen=True)
class WarmStartReport:
    source: str
    responses: int  # entries of the earlier run's first epoch matched to this train set
    rows: int  # rows of this train set warm-started
    prior_rows: int  # rows given a per-row prior from the column
    cap_responses: int  # entries fed to the cap's calibration
    tool_rows: int = 0  # rows whose tool calls were seeded (order_by=time)

    def line(self, num_rows: int) -> str:
        parts = []
        if self.source:
            parts.append(f"{self.rows} of {num_rows} rows warm-started from {self.source} "
                         f"({self.responses} responses of its first epoch; {num_rows - self.rows} rows keep the prior)")
        if self.tool_rows:
            parts.append(f"{self.tool_rows} rows with tool-call estimates")
        if self.prior_rows:
            parts.append(f"{self.prior_rows} rows with a per-row prior")
        return "; ".join(parts)


def trace_file(path: str) -> str:
    """``path`` itself, or ``<path>/length_traces.jsonl`` for a run directory."""
    candidate = os.path.join(path, "length_traces.jsonl") if os.path.isdir(path) else path
    if not os.path.isfile(candidate):
        raise WarmStartError(f"data.sampler.init_from (env SAMPLER_INIT_FROM)={path}: no length traces there; point "
                             "it at an earlier run's length_traces.jsonl or its run directory")
    return candidate


def matched_entries(path: str, keys: list[str]) -> dict[str, np.ndarray]:
    """The earlier run's responses on this train set's prompts: row (here), epoch (there), length, censored, tool
    calls and tool seconds (NaN where not recorded: single-turn traces, over-sample aborts). A prompt that appears in
    several rows gives each of them all of its responses."""
    index: dict[str, list[int]] = {}
    for i, k in enumerate(keys):
        index.setdefault(k, []).append(i)
    rows, epochs, lengths, censored, calls, tool_s = [], [], [], [], [], []
    records = read_records(path)
    if records and not all("prompt_keys" in r for r in records.values()):
        raise WarmStartError(f"data.sampler.init_from={path}: these traces carry no prompt keys (written before "
                             "warm start existed), so their rows cannot be matched by content; use a newer run's")
    for rec in records.values():
        limit = rec["response_length"]
        none = [None] * len(rec["lengths"])
        for key, length, finish, c, s in zip(rec["prompt_keys"], rec["lengths"], rec["finish"],
                                             rec.get("tool_calls") or none, rec.get("tool_s") or none):
            for row in index.get(key, ()):
                rows.append(row)
                epochs.append(rec["epoch"])
                lengths.append(length)
                censored.append(finish in TRUNCATED or finish == "abort" or length >= limit)
                calls.append(np.nan if c is None else c)
                tool_s.append(np.nan if s is None else s)
    return {"rows": np.array(rows, np.int64), "epochs": np.array(epochs, np.int64),
            "lengths": np.array(lengths, np.float64), "censored": np.array(censored, bool),
            "tool_calls": np.array(calls, np.float64), "tool_s": np.array(tool_s, np.float64)}


def warm_start(estimates, cap_policy, dataset, settings, time_key=None) -> WarmStartReport | None:
    """Seed ``estimates`` (and calibrate ``cap_policy``, if any; seed ``time_key``, the sampler's with
    ``order_by=time``, if any) from ``settings.sampler``; None when not asked."""
    s = settings.sampler
    if s.init_from is None and s.prior_column is None:
        return None
    prior_rows = 0
    if s.prior_column is not None:
        try:
            values = dataset.column(s.prior_column)
        except KeyError:
            raise WarmStartError(f"data.sampler.prior_column (env SAMPLER_PRIOR_COLUMN)={s.prior_column!r} is not a "
                                 "column of the train file") from None
        prior = np.array([np.nan if v is None else float(v) for v in values], np.float64)
        prior[~(prior > 0)] = np.nan  # 0, negative or missing: no prior for that row
        prior_rows = estimates.set_row_prior(prior)
    source, matched_first, seeded, fed, tool_rows = "", 0, 0, 0, 0
    if s.init_from is not None:
        source = trace_file(s.init_from)
        e = matched_entries(source, dataset.prompt_keys())
        if e["rows"].size:
            first = e["epochs"] == e["epochs"].min()
            matched_first = int(first.sum())
            seeded = estimates.warm_start(e["rows"][first], e["lengths"][first], e["censored"][first])
            if time_key is not None:
                tool_rows = time_key.warm_start(e["rows"][first], e["tool_calls"][first], e["tool_s"][first],
                                                e["censored"][first])
            if cap_policy is not None:
                fed = warm_start_cap(cap_policy, e["rows"], e["lengths"], e["censored"], e["epochs"],
                                     response_length=settings.response_length, ema_decay=s.ema_decay,
                                     statistic=s.statistic)
    return WarmStartReport(source, matched_first, seeded, prior_rows, fed, tool_rows)
