"""Finding and reading one run's logs: verl's file-logger JSONL, the recipe's length traces and (``run_config``) the
Hydra config of its launches.

verl's ``file`` backend (``verl.utils.tracking.FileLogger``) writes one ``{"step": N, "data": {metric: value}}`` line
per ``Tracking.log`` call to ``$VERL_FILE_LOGGER_PATH`` (else ``<root>/<project>/<experiment>.jsonl``), opening the
file with ``"wb"``: every (re)start truncates it, so a resumed run's history lives in several files once the trainer
rotates the old one away. Files are recognised by the shape of their first record, not by name, so any layout works
and other JSONL in the run directory (rollout dumps, traces) is not mistaken for metrics.
"""
from __future__ import annotations

import json
import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from recipe.report.run_config import RunConfig, find_config
from recipe.traces import is_trace_record, iter_jsonl, load_traces


class RunLogsError(Exception):
    """A run argument that does not lead to verl file-logger records (the CLI turns it into a usage error)."""


def is_metrics_record(obj) -> bool:
    """Whether a parsed JSON line has the shape verl's file logger writes."""
    return isinstance(obj, dict) and set(obj) == {"step", "data"} and isinstance(obj["data"], dict)


def _first_record(path: Path, max_lines: int = 5):
    """The first parseable JSON value among the first non-empty lines (None if there is none)."""
    try:
        with open(path, encoding="utf-8") as fp:
            seen = 0
            for line in fp:
                if not line.strip():
                    continue
                try:
                    return json.loads(line)
                except json.JSONDecodeError:
                    seen += 1
                    if seen >= max_lines:
                        return None
    except (OSError, UnicodeDecodeError):
        return None
    return None


def find_logs(path: str | os.PathLike) -> tuple[list[Path], list[Path]]:
    """(metric files, trace files) of a run: ``path`` itself if it is a file, else every ``*.jsonl`` below it,
    classified by the shape of its first record."""
    path = Path(path)
    if path.is_file():
        return [path], []
    metric_files, trace_files = [], []
    for f in sorted(path.rglob("*.jsonl")):
        rec = _first_record(f)
        if is_metrics_record(rec):
            metric_files.append(f)
        elif is_trace_record(rec):
            trace_files.append(f)
    return metric_files, trace_files


def _as_float(v) -> float | None:
    """Metric value as a float; None for values that are not scalars (orjson writes NaN as null)."""
    if v is None:
        return math.nan
    if isinstance(v, (bool, int, float)):
        return float(v)
    return None


def _read_metric_file(path: Path, notes: list[str]) -> list[tuple[int, dict[str, float]]]:
    records = []
    for lineno, rec in iter_jsonl(path):
        if rec is None:
            notes.append(f"{path}:{lineno}: skipped unparseable line (partial write at a crash?)")
        elif not is_metrics_record(rec) or not isinstance(rec["step"], int):
            notes.append(f"{path}:{lineno}: skipped line that is not a verl file-logger record")
        else:
            records.append((rec["step"], {k: x for k, v in rec["data"].items() if (x := _as_float(v)) is not None}))
    return records


def read_metrics(files: list[Path]) -> tuple[pd.DataFrame, list[str]]:
    """Merge metric files into one frame (index ``step``, one float column per metric, NaN = not logged) plus notes.

    Files are ordered by (first step, mtime, name): a resumed run restarts from a checkpoint at or after the
    previous file's first step, so content orders the segments even when copying the logs changed the mtimes;
    mtime breaks ties (a resume from the very checkpoint the previous segment started at). Records are merged per
    step in that order, later values of a metric overriding earlier ones, so a redone step keeps the resumed run's
    values while a record that only adds metrics (verl logs validation-before-train at the resume step) does not
    erase the training metrics already logged for that step.
    """
    notes: list[str] = []
    segments = []
    for f in files:
        records = _read_metric_file(f, notes)
        if records:
            segments.append((records[0][0], f.stat().st_mtime_ns, str(f), records))
    merged: dict[int, dict[str, float]] = {}
    counts: dict[int, int] = {}
    for *_, records in sorted(segments, key=lambda s: s[:3]):
        for step, data in records:
            merged.setdefault(step, {}).update(data)
            counts[step] = counts.get(step, 0) + 1
    repeated = sum(1 for c in counts.values() if c > 1)
    if repeated:
        notes.append(f"{repeated} step(s) were logged more than once (resume); the last value of each metric was kept")
    frame = pd.DataFrame.from_dict(merged, orient="index", dtype="float64").sort_index()
    frame.index.name = "step"
    return frame, notes


@dataclass
class Run:
    """One run's merged metrics (index ``step``), when present its length traces (one row per response) and the
    config of its last launch."""

    name: str
    path: Path
    metrics: pd.DataFrame
    traces: pd.DataFrame | None
    metric_files: list[Path] = field(default_factory=list)
    trace_files: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    config: RunConfig | None = None


def load_run(path: str | os.PathLike, name: str | None = None) -> Run:
    """Load a run directory (or a single file-logger JSONL).

    Raises RunLogsError when ``path`` does not exist or holds no verl file-logger records.
    """
    path = Path(path)
    if not path.exists():
        raise RunLogsError(f"'{path}' does not exist")
    metric_files, trace_files = find_logs(path)
    metrics, notes = read_metrics(metric_files)
    if metrics.empty:
        where = f"in '{path}'" if path.is_file() else f"under '{path}' (searched *.jsonl recursively)"
        raise RunLogsError(f"no verl file-logger records ({{\"step\": N, \"data\": {{...}}}} lines) {where}")
    traces = None
    if trace_files:
        trace_files.sort(key=lambda f: (f.stat().st_mtime_ns, str(f)))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            traces = load_traces(trace_files)
        notes += [str(w.message) for w in caught]
    config, config_notes = find_config(path)
    return Run(
        name=name or (path.stem if path.is_file() else path.resolve().name),
        path=path,
        metrics=metrics,
        traces=traces,
        metric_files=metric_files,
        trace_files=trace_files,
        notes=notes + config_notes,
        config=config,
    )
