"""Speculative decoding acceptance per step (``ROLLOUT_SPECULATIVE=ngram|suffix|group``), read from vLLM's counters.

verl 0.9.1 logs acceptance only for MTP (``vllm_async_server.py`` copies ``final_res.metrics.
request_spec_decode_stats`` into ``extra_fields`` only under ``rollout.mtp.enable_rollout``), and vLLM 0.24's
``RequestOutput`` carries no per-request speculative stats at all: the scheduler aggregates them per engine step
(``SchedulerStats.spec_decoding_stats``, ``vllm/v1/spec_decode/metrics.py`` ``SpecDecodingStats``) and the
frontend's ``PrometheusStatLogger`` adds them to three counters, ``vllm:spec_decode_num_drafts``,
``..._num_draft_tokens`` and ``..._num_accepted_tokens`` (one series per engine), beside ``vllm:generation_tokens``.
verl's ``vLLMHttpServer`` serves vLLM's OpenAI app, whose ``/metrics`` route exposes them, at each replica's
``LLMServerManager.server_addresses`` entry; the counters exist only with ``rollout.disable_log_stats=False``
(verl's default is True), which the preflight sets with speculation.

The trainer (``recipe/adapter/trainer.py``) reads every replica's counters before a step's generation
(``prepare_step``) and after it (``step``) and logs the difference, replica by replica: a replica that restarted in
between (its counters began again) or exposes only some of the counters leaves the step without these metrics, with
a warning naming it, rather than a sum that passes for the step's. Validation between steps is not counted there but
around ``_validate``, as ``val-aux/spec_*`` (verl validates greedily by default, where drafts are accepted far more
often than at the rollout's temperature). Per response there is nothing to read in vLLM 0.24, so the length traces
get the step's totals (``spec``), not a value per response.

Stdlib only (urllib); the parsing is unit-tested without a server (tests/adapter/test_spec_metrics.py).
"""
from __future__ import annotations

import logging
import urllib.request
from collections.abc import Iterable, Mapping

logger = logging.getLogger(__name__)

# vLLM's counter names (vllm/v1/spec_decode/metrics.py SpecDecodingProm; the tokens generated, v1/metrics/loggers.py
# PrometheusStatLogger); prometheus_client appends "_total"
SPEC_COUNTERS = {"drafts": "vllm:spec_decode_num_drafts", "draft_tokens": "vllm:spec_decode_num_draft_tokens",
                 "accepted_tokens": "vllm:spec_decode_num_accepted_tokens"}
COUNTERS = {**SPEC_COUNTERS, "generation_tokens": "vllm:generation_tokens"}
PREFIX = "rollout/spec_"
VAL_PREFIX = "val-aux/spec_"  # the same metrics over a validation (verl's greedy val_kwargs by default)
TIMEOUT_S = 10.0


def parse_counters(text: str) -> dict[str, float]:
    """The counters (``COUNTERS``), summed over their series (engines), from a Prometheus text exposition; a counter
    that is absent (no speculation configured, or stats disabled) is missing from the result."""
    out: dict[str, float] = {}
    wanted = {name + "_total": key for key, name in COUNTERS.items()}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_end = min((i for i in (line.find("{"), line.find(" ")) if i >= 0), default=-1)
        if name_end < 0:
            continue
        key = wanted.get(line[:name_end])
        if key is None:
            continue
        value = line.rsplit("}", 1)[-1].split()[0] if "}" in line else line.split()[1]
        out[key] = out.get(key, 0.0) + float(value)
    return out


def scrape(addresses: Iterable[str], timeout_s: float = TIMEOUT_S) -> dict[str, dict[str, float]] | None:
    """Each replica's counters, by its address in ``addresses`` (``host:port``, IPv6 in brackets); None when a
    replica cannot be read or lacks any of the counters (logged, once per call): a sum over part of the
    replicas or part of the counters would pass for the step's acceptance."""
    readings: dict[str, dict[str, float]] = {}
    for address in addresses:
        try:
            with urllib.request.urlopen(f"http://{address}/metrics", timeout=timeout_s) as r:  # noqa: S310
                counters = parse_counters(r.read().decode("utf-8", "replace"))
        except Exception as e:  # noqa: BLE001 - a metric, never a reason to stop training
            logger.warning("speculative decoding metrics: cannot read http://%s/metrics: %s", address, e)
            return None
        missing = [f"{COUNTERS[k]}_total" for k in COUNTERS if k not in counters]
        if missing:
            logger.warning("speculative decoding metrics: http://%s/metrics has no %s (rollout.disable_log_stats "
                           "must be False)", address, ", ".join(missing))
            return None
        readings[address] = counters
    return readings


def growth(before: Mapping[str, Mapping[str, float]],
           after: Mapping[str, Mapping[str, float]]) -> dict[str, float] | None:
    """How much each counter grew from ``before`` to ``after`` (:func:`scrape` readings), summed over the replicas; a
    replica first read in ``after`` counts from 0 (it started in between). None (logged) when a replica's counter
    went down or the replica is gone: it restarted, its counts began again, and what it did in between is unknown
    (a difference would undercount, or come out negative)."""
    total = dict.fromkeys(COUNTERS, 0.0)
    for address in sorted(before.keys() | after.keys()):
        b, a = before.get(address, dict.fromkeys(COUNTERS, 0.0)), after.get(address)
        if a is None or any(a[k] < b[k] for k in COUNTERS):
            logger.warning("speculative decoding metrics: the counters of http://%s/metrics went down or vanished "
                           "between two readings (the replica restarted?); no rollout/spec_* for this step", address)
            return None
        for k in COUNTERS:
            total[k] += a[k] - b[k]
    return total


def step_metrics(before: Mapping[str, Mapping[str, float]] | None,
                 after: Mapping[str, Mapping[str, float]] | None) -> dict[str, float]:
    """The step's acceptance from two :func:`scrape` readings (empty when either is missing or the counters did not
    only grow, see :func:`growth`): ``rollout/spec_drafts`` (verification steps of requests that had a draft),
    ``..._draft_tokens``, ``..._accepted_tokens``, ``..._generation_tokens``, ``rollout/spec_draft_acceptance_rate``
    (accepted / drafted tokens), ``rollout/spec_acceptance_length`` (tokens emitted per drafted verification step,
    1 + accepted / drafts: what verl's MTP ``rollout/spec_accept_length`` measures, over the step's drafts rather
    than per request) and ``rollout/spec_tokens_per_step``: tokens per target step over all of a request's steps,
    drafted or not, its prefill (first token) included. Each step of a request emits one token plus the drafts it
    accepted, so the steps are generated - accepted tokens. This is what speculation buys: a schedule that drafts
    only in the tail has a high acceptance length over few steps and a tokens per step near 1 (what
    ``python -m recipe.sim.acceptance`` estimates as ``tokens_per_step``). vLLM counts a last step's accepted drafts
    past ``max_tokens`` before it cuts the output, so a capped response can nudge it down slightly."""
    d = None if before is None or after is None else growth(before, after)
    if d is None:
        return {}
    m = {PREFIX + k: v for k, v in d.items()}
    m[PREFIX + "draft_acceptance_rate"] = d["accepted_tokens"] / d["draft_tokens"] if d["draft_tokens"] else 0.0
    m[PREFIX + "acceptance_length"] = 1.0 + d["accepted_tokens"] / d["drafts"] if d["drafts"] else 1.0
    steps = d["generation_tokens"] - d["accepted_tokens"]
    m[PREFIX + "tokens_per_step"] = d["generation_tokens"] / steps if steps > 0 else 1.0
    return m


def trace_fields(metrics: Mapping[str, float]) -> dict | None:
    """The step's totals for the length trace (``spec``), None when the step has no acceptance metrics."""
    if PREFIX + "drafts" not in metrics:
        return None
    return {"drafts": int(metrics[PREFIX + "drafts"]), "draft_tokens": int(metrics[PREFIX + "draft_tokens"]),
            "accepted_tokens": int(metrics[PREFIX + "accepted_tokens"]),
            "acceptance_length": float(metrics[PREFIX + "acceptance_length"]),
            "tokens_per_step": float(metrics[PREFIX + "tokens_per_step"])}


class SpecAcceptanceMeter:
    """Reads the replicas' counters around each step's generation. ``addresses`` is called at each reading (verl's
    ``LLMServerManager.server_addresses``), so replicas added later are read too."""

    def __init__(self, addresses):
        self.addresses = addresses
        self._before: dict[str, dict[str, float]] | None = None

    def begin(self) -> None:
        self._before = scrape(self.addresses())

    def around(self, fn):
        """``fn()``'s result (a metrics dict, verl's ``_validate``) with the acceptance of what it generated, under
        ``val-aux/spec_*``."""
        before = scrape(self.addresses())
        out = fn()
        m = step_metrics(before, scrape(self.addresses()))
        if isinstance(out, dict):
            out.update({VAL_PREFIX + k[len(PREFIX):]: v for k, v in m.items()})
        return out

    def end(self) -> dict[str, float]:
        after = scrape(self.addresses())
        m = step_metrics(self._before, after)
        self._before = None
        return m
