"""Response-length traces for the rollout simulator: generated (documented, seeded) or recorded by the trainer.

A trace is what the model *would* generate for every (epoch, prompt, sample) if nothing stopped it early:
``lengths[epoch, row, sample]``, clipped at ``response_length`` (a value equal to ``response_length`` is a response
the configured limit truncates). Policies decide which prompts share a step and how far a cap cuts them; the trace
does not depend on the policy, so every policy replays the same responses.

Generated traces (``generate``) model, per response, in log space::

    log L = log_scale + mode_offset[i] + between_sigma * z_i            (prompt difficulty, lognormal)
            + e * log(drift) + epoch_sigma * (xi_i1 + ... + xi_ie)      (slow drift + random walk of the level)
            + within_sigma * z_eis                                      (spread inside the GRPO group)
            + [with prob. tail_prob] log Pareto(tail_alpha)             (runaway generations, heavy_tail only)

The random walk makes the estimate from epoch e-1 stale for epoch e, and the within-group noise makes a group of
n responses an imperfect measurement of the prompt's level even without the walk.

Calibration (not tuned to any policy): ``log_scale`` is solved so that the epoch-0 mean of the clipped lengths is
``target_mean``; when ``between_sigma`` is None it is solved jointly so that ``target_truncated`` of the epoch-0
responses hit ``response_length``. Both solves run on a fixed Monte-Carlo sample of the marginal, independent of
``seed``. The reference targets are the public Qwen3-30B-A3B / DeepScaleR numbers for a 16384-token budget: mean
output ~5916 tokens, ~3-5% of responses truncated (4% used). ``within_sigma`` (0.40: a group's 5-95% range spans
about x3.7), ``drift`` and ``epoch_sigma`` are assumptions stated here, not fitted.

Recorded traces (``load_recorded``) come from the trainer's per-step JSONL (``recipe.traces.LengthTraceWriter``).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from recipe.traces import read_records  # the last-record-per-step reading the report uses too

RESPONSE_LENGTH = 16384


@dataclass(frozen=True)
class TraceParams:
    """Parameters of a generated trace (see the module docstring for the model)."""

    num_prompts: int = 1024
    n: int = 16
    epochs: int = 4
    response_length: int = RESPONSE_LENGTH
    seed: int = 0
    target_mean: float = 5916.0  # epoch-0 mean output tokens (clipped), Qwen3-30B-A3B on DeepScaleR @16k
    target_truncated: float = 0.04  # epoch-0 fraction at response_length; used only when between_sigma is None
    between_sigma: float | None = None  # log-sd of prompt levels (None: solved from target_truncated)
    within_sigma: float = 0.40  # log-sd of responses around their prompt's level
    drift: float = 1.02  # multiplicative length trend per epoch (a mild growth, as long-CoT RL runs tend to show)
    epoch_sigma: float = 0.15  # log-sd of the per-epoch random-walk step of each prompt's level
    tail_prob: float = 0.0  # per-response probability of a Pareto-multiplied (runaway) length
    tail_alpha: float = 1.5  # Pareto shape of that multiplier (smaller = heavier)
    short_frac: float = 0.0  # fraction of prompts in the short mode (bimodal); 0 = one mode
    mode_ratio: float = 1.0  # median length of the long mode / the short mode
    min_length: int = 16


SHAPES: dict[str, dict] = {
    # Calibrated on the public numbers: between_sigma solved from the 4% truncation target.
    "reference": {},
    # Wider groups plus 3% runaway responses with a Pareto(1.2) multiplier; same mean, truncation is an outcome.
    "heavy_tail": {"between_sigma": 0.45, "within_sigma": 0.55, "tail_prob": 0.03, "tail_alpha": 1.2},
    # Half easy prompts, half hard ones 6x longer (e.g. a mixed easy/competition set); same mean.
    "bimodal": {"between_sigma": 0.30, "short_frac": 0.5, "mode_ratio": 6.0},
}


@dataclass
class Trace:
    """Per-(epoch, row, sample) desired lengths and what is known about them.

    ``censored`` marks values that are only lower bounds (recorded responses cut by a cap or aborted: the model
    wanted at least that many tokens). ``row_ids`` maps rows to the trainer's ``dataset_item_idx``.
    """

    name: str
    lengths: np.ndarray  # (epochs, rows, n) int64, clipped at response_length
    response_length: int
    censored: np.ndarray  # (epochs, rows, n) bool
    row_ids: np.ndarray  # (rows,) int64
    params: dict = field(default_factory=dict)
    level: np.ndarray | None = None  # (epochs, rows) log-level of each prompt (generated traces only)

    def __post_init__(self):
        self.lengths = np.asarray(self.lengths, dtype=np.int64)
        self.censored = np.asarray(self.censored, dtype=bool)
        self.row_ids = np.asarray(self.row_ids, dtype=np.int64)
        if self.lengths.ndim != 3 or self.censored.shape != self.lengths.shape:
            raise ValueError(f"lengths {self.lengths.shape} / censored {self.censored.shape}: want equal (E, N, n)")
        if self.row_ids.shape != (self.lengths.shape[1],):
            raise ValueError(f"row_ids {self.row_ids.shape} does not match {self.lengths.shape[1]} rows")
        if self.lengths.size and (self.lengths.min() < 1 or self.lengths.max() > self.response_length):
            raise ValueError(f"lengths must lie in [1, response_length={self.response_length}]")

    @property
    def epochs(self) -> int:
        return self.lengths.shape[0]

    @property
    def num_prompts(self) -> int:
        return self.lengths.shape[1]

    @property
    def n(self) -> int:
        return self.lengths.shape[2]

    @property
    def truncated(self) -> np.ndarray:
        return self.lengths >= self.response_length

    def attempt_lengths(self, epoch: int, rows: np.ndarray, attempt: np.ndarray) -> np.ndarray:
        """Desired lengths of ``rows`` on their ``attempt``-th launch in ``epoch`` (0 = the trace's responses).

        A prompt aborted by over-sampling and launched again draws n fresh responses around the same level (what
        the model does); a recorded trace has no other draw, so a retry replays the recorded responses (a
        pessimistic choice: a prompt that lost the race once is exactly as long the next time).
        """
        out = self.lengths[epoch, rows].copy()
        retry = np.asarray(attempt) > 0
        if self.level is None or not retry.any():
            return out
        p = self.params
        for a in np.unique(attempt[retry]):
            rng = np.random.default_rng([p["seed"], epoch, int(a), 1])
            sel = np.flatnonzero(attempt == a)
            offsets = _within(rng, (self.num_prompts, self.n), p)[rows[sel]]  # independent of who else retries
            log_len = self.level[epoch, rows[sel], None] + offsets
            out[sel] = np.clip(np.rint(np.exp(log_len)), p["min_length"], self.response_length)
        return out

    def previous_run(self, epochs: int | None = None) -> Trace:
        """An earlier run on the same prompts from the same base model, to warm-start from (``epochs``: default as
        many as this trace). Its epoch 0 shares this run's prompt levels (a property of base model and prompt); its
        later epochs follow their own drift and random walk; every response is a fresh draw from its own seeded
        stream. It never contains this run's responses, so a warm start cannot peek at the epochs being replayed."""
        if self.level is None:
            raise ValueError(f"trace {self.name!r} is recorded: warm-start it from a recording of an earlier run "
                             "(--warm-start-from PATH.jsonl)")
        p = self.params
        e = int(epochs or self.epochs)
        rng = np.random.default_rng([int(p["seed"]), 2])
        walk = np.cumsum(p["epoch_sigma"] * rng.standard_normal((e, self.num_prompts)), axis=0)
        walk[0] = 0.0
        level = self.level[0][None, :] + np.arange(e)[:, None] * math.log(p["drift"]) + walk
        log_len = level[:, :, None] + _within(rng, (e, self.num_prompts, self.n), p)
        lengths = np.clip(np.rint(np.exp(log_len)), p["min_length"], self.response_length).astype(np.int64)
        return Trace(name=f"{self.name}/previous-run", lengths=lengths, response_length=self.response_length,
                     censored=np.zeros(lengths.shape, bool), row_ids=self.row_ids.copy(),
                     params={**p, "epochs": e, "previous_run": True}, level=level)

    def subset(self, *, epochs: int | None = None, prompts: int | None = None, n: int | None = None) -> Trace:
        """The first ``epochs`` epochs, ``prompts`` rows and ``n`` samples (each at most what the trace has)."""
        e, p, k = (min(v, cur) if v else cur
                   for v, cur in ((epochs, self.epochs), (prompts, self.num_prompts), (n, self.n)))
        return dataclasses.replace(
            self,
            lengths=self.lengths[:e, :p, :k],
            censored=self.censored[:e, :p, :k],
            row_ids=self.row_ids[:p],
            level=None if self.level is None else self.level[:e, :p],
            params={**self.params, "epochs": e, "num_prompts": p, "n": k},
        )

    def with_response_length(self, response_length: int) -> Trace:
        """Replay under a smaller limit (exact: clipping commutes). A larger one is refused: a response recorded as
        truncated at the old limit tells nothing about how far it would have gone."""
        if response_length == self.response_length:
            return self
        if response_length > self.response_length:
            raise ValueError(
                f"trace {self.name!r} was made with response_length={self.response_length}; cannot replay it at"
                f" {response_length} (lengths beyond the old limit are unknown)"
            )
        return dataclasses.replace(
            self,
            lengths=np.minimum(self.lengths, response_length),
            censored=self.censored & (self.lengths < response_length),
            response_length=int(response_length),
            params={**self.params, "response_length": int(response_length)},
        )

    def scaled(self, response_length: int) -> Trace:
        """The same trace in units of ``response_length / self.response_length`` (for replays on a small engine):
        every length multiplied by that factor and rounded (at least 1), so a response truncated at the old limit
        is truncated at the new one. Retries of a generated trace keep drawing from the same, rescaled levels."""
        f = response_length / self.response_length
        if not 0 < f <= 1:
            raise ValueError(f"scale to response_length {response_length}: must lie in [1, {self.response_length}]")
        lengths = np.clip(np.rint(self.lengths * f), 1, response_length).astype(np.int64)
        lengths[self.truncated] = response_length
        params = {**self.params, "response_length": int(response_length), "scaled_from": self.response_length,
                  "scale": f}
        if "min_length" in params:
            params["min_length"] = max(1, int(round(params["min_length"] * f)))
        return dataclasses.replace(self, lengths=lengths, response_length=int(response_length), params=params,
                                   level=None if self.level is None else self.level + math.log(f))

    def summary(self) -> dict:
        """Per-epoch mean length and truncated fraction (what the calibration targets)."""
        return {
            "mean_length_per_epoch": [round(float(x), 1) for x in self.lengths.mean(axis=(1, 2))],
            "truncated_fraction_per_epoch": [round(float(x), 4) for x in self.truncated.mean(axis=(1, 2))],
            "censored_fraction": round(float(self.censored.mean()), 4),
        }


# -- generation --------------------------------------------------------------------------------------------------
_CALIBRATION_DRAWS = 200_000


def _marginal_log_offsets(p: TraceParams, between_sigma: float) -> np.ndarray:
    """Epoch-0 log-length of one response minus log_scale, on a fixed sample (independent of ``p.seed``)."""
    rng = np.random.default_rng(20240917)
    draws = _CALIBRATION_DRAWS
    x = between_sigma * rng.standard_normal(draws) + _mode_offset(p, rng.random(draws))
    return x + _within(rng, (draws,), dataclasses.asdict(p))


def _mode_offset(p: TraceParams, u: np.ndarray) -> np.ndarray:
    return np.where(u < p.short_frac, 0.0, math.log(p.mode_ratio)) if p.short_frac > 0 else np.zeros_like(u)


def _clipped(p: TraceParams, log_scale: float, offsets: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(np.exp(log_scale + offsets)), p.min_length, p.response_length)


def _solve_scale(p: TraceParams, offsets: np.ndarray) -> float:
    """log_scale giving the target clipped mean (the clipped mean is increasing in log_scale)."""
    if not p.min_length < p.target_mean < p.response_length:
        raise ValueError(f"target_mean {p.target_mean} must lie strictly inside (min_length, response_length)")
    lo, hi = math.log(p.min_length) - 10.0, math.log(p.response_length) + 10.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if _clipped(p, mid, offsets).mean() < p.target_mean else (lo, mid)
    return 0.5 * (lo + hi)


def calibrate(p: TraceParams) -> tuple[float, float]:
    """(log_scale, between_sigma) meeting the targets; see the module docstring. Depends only on the marginal's
    parameters, so it is cached on those (a solve takes about a second)."""
    return _calibrate(dataclasses.replace(p, num_prompts=1, n=1, epochs=1, seed=0, drift=1.0, epoch_sigma=0.0))


@functools.lru_cache(maxsize=32)
def _calibrate(p: TraceParams) -> tuple[float, float]:
    if p.between_sigma is not None:
        return _solve_scale(p, _marginal_log_offsets(p, p.between_sigma)), float(p.between_sigma)

    def trunc_at(sigma: float) -> tuple[float, float]:
        off = _marginal_log_offsets(p, sigma)
        scale = _solve_scale(p, off)
        return float((_clipped(p, scale, off) >= p.response_length).mean()), scale

    lo, hi = 0.0, 3.0
    if not trunc_at(lo)[0] <= p.target_truncated <= trunc_at(hi)[0]:
        raise ValueError(f"target_truncated {p.target_truncated} is not reachable with within_sigma {p.within_sigma}")
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if trunc_at(mid)[0] < p.target_truncated else (lo, mid)
    sigma = 0.5 * (lo + hi)
    return trunc_at(sigma)[1], sigma


def generate(shape: str = "reference", **overrides) -> Trace:
    """A seeded trace of one of ``SHAPES`` with ``TraceParams`` overrides (e.g. ``num_prompts``, ``seed``)."""
    if shape not in SHAPES:
        raise ValueError(f"unknown trace shape {shape!r}; choose one of {sorted(SHAPES)} or a recorded .jsonl")
    p = TraceParams(**{**SHAPES[shape], **overrides})
    if p.num_prompts < 1 or p.n < 1 or p.epochs < 1:
        raise ValueError("num_prompts, n and epochs must be >= 1")
    log_scale, between_sigma = calibrate(p)
    rng = np.random.default_rng(p.seed)
    level = log_scale + between_sigma * rng.standard_normal(p.num_prompts) + _mode_offset(p, rng.random(p.num_prompts))
    walk = np.cumsum(p.epoch_sigma * rng.standard_normal((p.epochs, p.num_prompts)), axis=0)
    walk[0] = 0.0  # epoch 0 is the calibrated distribution
    level_e = level[None, :] + np.arange(p.epochs)[:, None] * math.log(p.drift) + walk
    shape3 = (p.epochs, p.num_prompts, p.n)
    log_len = level_e[:, :, None] + _within(rng, shape3, dataclasses.asdict(p))
    lengths = np.clip(np.rint(np.exp(log_len)), p.min_length, p.response_length).astype(np.int64)
    params = {"shape": shape, **dataclasses.asdict(p), "between_sigma": round(between_sigma, 4),
              "median_length_epoch0": round(math.exp(log_scale), 1)}
    return Trace(name=shape, lengths=lengths, response_length=p.response_length, censored=np.zeros(shape3, bool),
                 row_ids=np.arange(p.num_prompts), params=params, level=level_e)


def _within(rng: np.random.Generator, shape: tuple, p: dict) -> np.ndarray:
    """Log-offsets of responses around their prompt's level: lognormal spread plus the optional Pareto tail."""
    x = p["within_sigma"] * rng.standard_normal(shape)
    if p["tail_prob"] > 0:
        tail = rng.random(shape) < p["tail_prob"]
        x = x + np.where(tail, np.log(rng.pareto(p["tail_alpha"], shape) + 1.0), 0.0)
    return x


# -- recorded traces ---------------------------------------------------------------------------------------------
CENSORED_AS = ("observed", "response_length")


def load_recorded(path: str | Path, censored_as: str = "observed") -> Trace:
    """A trace from the trainer's per-step JSONL (``recipe.traces`` format; the last record of a step wins).

    A record holds ``epoch, step, cap, response_length, gen_time_s`` and, one entry per response, ``rows``
    (dataset_item_idx), ``sample_index``, ``lengths``, ``finish`` (eos | length | cap | abort) and ``predicted``.
    Per (epoch, row) the first complete group (n responses, none aborted) is used; a row that only has aborted
    attempts in an epoch uses its longest attempt with the aborted entries censored. ``finish == "length"`` is
    exact for any replay at the recorded ``response_length`` or below (a step recorded under a smaller limit than
    the run's largest gives a lower bound). Entries cut by a cap or an abort are lower bounds (``censored``):
    ``censored_as="observed"`` replays them at the observed length (optimistic for policies whose cap is looser
    than the recorded one), ``"response_length"`` at the limit (pessimistic); run both to bracket the truth.
    Epochs that do not cover every row are dropped (listed in ``params["dropped_epochs"]``).
    """
    if censored_as not in CENSORED_AS:
        raise ValueError(f"censored_as {censored_as!r} is not one of {CENSORED_AS}")
    records = list(read_records(path).values())
    if not records:
        raise ValueError(f"{path}: no length-trace records")
    response_length = max(int(r["response_length"]) for r in records)
    # (epoch, row) -> attempts, each {sample: (length, finish, lower_bound)}
    attempts: dict[tuple[int, int], list[dict[int, tuple[int, str, bool]]]] = {}
    n = 0
    for rec in records:
        rl = int(rec["response_length"])
        per_row: dict[int, dict[int, tuple[int, str, bool]]] = {}
        for row, s, length, fin in zip(rec["rows"], rec["sample_index"], rec["lengths"], rec["finish"]):
            lower = fin in ("cap", "abort") or (fin == "length" and rl < response_length)
            per_row.setdefault(int(row), {})[int(s)] = (rl if fin == "length" else int(length), fin, lower)
            n = max(n, int(s) + 1)
        for row, attempt in per_row.items():
            attempts.setdefault((int(rec["epoch"]), row), []).append(attempt)
    epochs_seen = sorted({e for e, _ in attempts})
    rows = np.array(sorted({r for _, r in attempts}), dtype=np.int64)
    kept_epochs = [e for e in epochs_seen if all((e, int(r)) in attempts for r in rows)]
    if not kept_epochs:
        raise ValueError(f"{path}: no epoch covers all {len(rows)} rows")
    lengths = np.ones((len(kept_epochs), len(rows), n), np.int64)
    censored = np.ones(lengths.shape, bool)  # a sample missing from the chosen attempt is unknown
    for ei, e in enumerate(kept_epochs):
        for ri, r in enumerate(rows.tolist()):
            tries = attempts[(e, r)]
            complete = [a for a in tries if len(a) == n and all(f != "abort" for _, f, _ in a.values())]
            chosen = complete[0] if complete else max(tries, key=lambda a: sum(x for x, _, _ in a.values()))
            for s, (length, _, lower) in chosen.items():
                lengths[ei, ri, s] = length
                censored[ei, ri, s] = lower
    lengths = np.clip(lengths, 1, response_length)
    if censored_as == "response_length":
        lengths = np.where(censored, response_length, lengths)
    params = {"shape": "recorded", "path": str(path), "censored_as": censored_as, "epochs": len(kept_epochs),
              "num_prompts": len(rows), "n": n, "response_length": response_length,
              "recorded_epochs": kept_epochs, "dropped_epochs": [e for e in epochs_seen if e not in kept_epochs]}
    return Trace(name=Path(path).name, lengths=lengths, response_length=response_length, censored=censored,
                 row_ids=rows, params=params)


def engine_records(path: str | Path) -> list[dict]:
    """Per-step ``(max_len, sum_len, time_s)`` from a recorded JSONL, for ``engine.fit_engine``."""
    out = []
    for rec in read_records(path).values():
        if rec.get("gen_time_s") and rec["lengths"]:
            out.append({"max_len": max(rec["lengths"]), "sum_len": sum(rec["lengths"]), "time_s": rec["gen_time_s"]})
    return out


def load(spec: str, **overrides) -> Trace:
    """``spec`` is a shape name (generated with ``overrides``) or a recorded ``.jsonl`` path."""
    if spec.endswith(".jsonl") or Path(spec).is_file():
        censored_as = overrides.pop("censored_as", "observed")
        trace = load_recorded(spec, censored_as=censored_as)
        if "response_length" in overrides:
            trace = trace.with_response_length(overrides.pop("response_length"))
        trace = trace.subset(epochs=overrides.pop("epochs", None), prompts=overrides.pop("num_prompts", None),
                             n=overrides.pop("n", None))
        if overrides:
            raise ValueError(f"options {sorted(overrides)} do not apply to a recorded trace")
        return trace
    return generate(spec, **overrides)


__all__ = ["Trace", "TraceParams", "SHAPES", "generate", "calibrate", "load_recorded", "engine_records", "load",
           "CENSORED_AS"]
