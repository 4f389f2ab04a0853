"""Multi-turn traces: the shapes, their draws, and the segment arithmetic (the package docstring says what they
assume).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from ..trace import Trace


LATENCY_KINDS = ("loguniform", "lognormal")


# -- traces ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MTShape:
    num_prompts: int = 512
    n: int = 8
    epochs: int = 4
    response_length: int = 16384
    seed: int = 0
    max_calls: int = 8  # tool calls per trajectory: 1 + Binomial(max_calls - 1, p(z))
    calls_logit: float = -0.3
    calls_coef: float = 0.8  # harder prompts (larger z) make more calls
    turn_median: float = 700.0  # assistant tokens per turn at z = 0
    between_sigma: float = 0.45  # log-sd of a prompt's turn length level (times z)
    within_sigma: float = 0.6  # log-sd of one turn around its prompt's level
    min_turn: int = 16
    tool_tokens_median: float = 250.0
    tool_tokens_sigma: float = 0.8
    latency: str = "loguniform"  # loguniform on [latency_lo, latency_hi] | lognormal(latency_median, latency_sigma)
    latency_lo: float = 0.5
    latency_hi: float = 10.0
    latency_median: float = 3.0
    latency_sigma: float = 1.0
    epoch_sigma: float = 0.3  # sd of the per-epoch random-walk step of z

    def __post_init__(self):
        if self.max_calls < 1 or self.latency not in LATENCY_KINDS or not 0 <= self.latency_lo <= self.latency_hi:
            raise ValueError(f"MTShape: max_calls >= 1, latency one of {LATENCY_KINDS}, 0 <= latency_lo <= hi")


MT_SHAPES: dict[str, dict] = {
    "mt-reference": {},
    "mt-heldout": {"max_calls": 12, "calls_logit": -1.2, "calls_coef": 1.2, "turn_median": 500.0,
                   "tool_tokens_median": 400.0, "latency": "lognormal", "latency_median": 3.0, "latency_sigma": 1.0,
                   "latency_lo": 0.2, "latency_hi": 60.0},
}


def clip_budget(seg: np.ndarray, budget) -> np.ndarray:
    """Segments clipped in order to ``budget`` total tokens (broadcast over the leading axes)."""
    seg = np.asarray(seg, dtype=np.int64)
    b = np.asarray(budget, dtype=np.int64)[..., None] if np.ndim(budget) else int(budget)
    before = np.cumsum(seg, axis=-1) - seg
    return np.minimum(seg, np.maximum(0, b - before))


def segment_count(seg: np.ndarray) -> np.ndarray:
    """Segments a trajectory has (the last non-zero one + 1; clipping zeroes only a suffix)."""
    nz = np.asarray(seg) > 0
    last = nz.shape[-1] - 1 - np.argmax(nz[..., ::-1], axis=-1)
    return np.where(nz.any(axis=-1), last + 1, 0)


def _draw(rng: np.random.Generator, z: np.ndarray, n: int, s: MTShape) -> tuple[np.ndarray, np.ndarray]:
    r, k = len(z), s.max_calls + 1
    p = 1.0 / (1.0 + np.exp(-(s.calls_logit + s.calls_coef * z)))
    calls = 1 + rng.binomial(s.max_calls - 1, np.broadcast_to(p[:, None], (r, n)))
    turn = np.exp(math.log(s.turn_median) + s.between_sigma * z[:, None, None]
                  + s.within_sigma * rng.standard_normal((r, n, k)))
    a = np.maximum(np.rint(turn), s.min_turn).astype(np.int64)
    o = np.maximum(np.rint(np.exp(math.log(s.tool_tokens_median)
                                  + s.tool_tokens_sigma * rng.standard_normal((r, n, k)))), 1).astype(np.int64)
    if s.latency == "loguniform":
        lat = np.exp(rng.uniform(math.log(s.latency_lo), math.log(s.latency_hi), (r, n, k)))
    else:
        lat = np.clip(np.exp(math.log(s.latency_median) + s.latency_sigma * rng.standard_normal((r, n, k))),
                      s.latency_lo, s.latency_hi)
    j = np.arange(k)
    a = np.where(j < (calls + 1)[..., None], a, 0)
    o = np.where(j < calls[..., None], o, 0)
    seg = np.empty((r, n, 2 * k), np.int64)
    seg[..., 0::2], seg[..., 1::2] = a, o
    return clip_budget(seg, s.response_length), np.where(j < calls[..., None], lat, 0.0)


@dataclass
class MTTrace:
    name: str
    shape: MTShape
    z: np.ndarray  # (epochs, prompts) difficulty of each prompt in each epoch
    seg: np.ndarray  # (epochs, prompts, n, 2K) clipped segments
    lat: np.ndarray  # (epochs, prompts, n, K) tool latencies (s)
    stream: int = 0  # 0: this run; 2: an earlier run (previous_run)

    @property
    def epochs(self) -> int:
        return self.seg.shape[0]

    @property
    def num_prompts(self) -> int:
        return self.seg.shape[1]

    @property
    def n(self) -> int:
        return self.seg.shape[2]

    @property
    def response_length(self) -> int:
        return self.shape.response_length

    @property
    def totals(self) -> np.ndarray:
        return self.seg.sum(axis=-1)

    @property
    def calls(self) -> np.ndarray:
        return (self.seg[..., 1::2] > 0).sum(axis=-1)

    def attempt(self, epoch: int, rows: np.ndarray, attempt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Segments and latencies of ``rows`` on their ``attempt``-th launch (0: the trace's; a restarted prompt
        draws fresh trajectories around the same difficulty, independent of which other rows retry)."""
        rows, attempt = np.asarray(rows, np.int64), np.asarray(attempt, np.int64)
        seg, lat = self.seg[epoch, rows].copy(), self.lat[epoch, rows].copy()
        for a in np.unique(attempt[attempt > 0]):
            rng = np.random.default_rng([self.shape.seed, self.stream, epoch, int(a), 1])
            s2, l2 = _draw(rng, self.z[epoch], self.n, self.shape)
            sel = np.flatnonzero(attempt == a)
            seg[sel], lat[sel] = s2[rows[sel]], l2[rows[sel]]
        return seg, lat

    def as_trace(self) -> Trace:
        """The trajectory totals as a single-turn ``Trace`` (warm start, oracle order, reports)."""
        tot = np.maximum(self.totals, 1)
        return Trace(name=self.name, lengths=tot, response_length=self.response_length,
                     censored=np.zeros(tot.shape, bool), row_ids=np.arange(self.num_prompts),
                     params={"shape": self.name, **dataclasses.asdict(self.shape)})

    def previous_run(self) -> MTTrace:
        """An earlier run on the same prompts: the same epoch-0 difficulties, its own walk and draws."""
        return _generate(self.name, self.shape, stream=2, z0=self.z[0])

    def summary(self) -> dict:
        tot, calls = self.totals, self.calls
        return {"mean_tokens": round(float(tot.mean()), 1),
                "truncated_fraction": round(float((tot >= self.response_length).mean()), 4),
                "mean_tool_calls": round(float(calls.mean()), 2),
                "mean_tool_latency_s": round(float(self.lat[self.seg[..., 1::2] > 0].mean()), 2),
                "mean_tool_seconds_per_trajectory": round(float(self.lat.sum(axis=-1).mean()), 1)}


def _generate(name: str, s: MTShape, stream: int = 0, z0: np.ndarray | None = None) -> MTTrace:
    rng = np.random.default_rng([s.seed, stream])
    z = rng.standard_normal(s.num_prompts) if z0 is None else np.asarray(z0, np.float64)
    walk = np.cumsum(s.epoch_sigma * rng.standard_normal((s.epochs, s.num_prompts)), axis=0)
    walk[0] = 0.0
    ze = z[None, :] + walk
    segs, lats = zip(*(_draw(rng, ze[e], s.n, s) for e in range(s.epochs)))
    return MTTrace(name=name, shape=s, z=ze, seg=np.stack(segs), lat=np.stack(lats), stream=stream)


def generate_mt(shape: str = "mt-reference", **overrides) -> MTTrace:
    if shape not in MT_SHAPES:
        raise ValueError(f"unknown multi-turn shape {shape!r}; choose one of {sorted(MT_SHAPES)}")
    return _generate(shape, MTShape(**{**MT_SHAPES[shape], **overrides}))


def from_turns(turns: list[list[tuple[int, float, int]]], response_length: int = 16384) -> tuple[np.ndarray,
                                                                                                   np.ndarray]:
    """Segments and latencies of hand-written trajectories: each a list of turns ``(assistant tokens, tool latency,
    tool tokens)``, the last turn's tool ignored (tests, examples)."""
    k = max(len(t) for t in turns)
    seg = np.zeros((len(turns), 2 * k), np.int64)
    lat = np.zeros((len(turns), k))
    for i, traj in enumerate(turns):
        for j, (a, latency, o) in enumerate(traj):
            seg[i, 2 * j] = a
            if j < len(traj) - 1:
                seg[i, 2 * j + 1], lat[i, j] = o, latency
    return clip_budget(seg, response_length), lat


# -- engine ------------------------------------------------------------------------------------------------------
