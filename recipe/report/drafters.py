"""The report's drafter section: on a run that recorded its responses' token ids (``RECORD_TOKENS=1``,
``<run>/tokens``), the tokens per target step each speculative drafter would give (``recipe.sim.acceptance``), so
the A/B report says which drafter pays before one is turned on. Runs without recordings add nothing.

Bounded: each run's estimate reads at most ``MAX_GROUPS`` groups and ``MAX_TEXT_BYTES`` of their JSON, the prompts
with the smallest hash of their row id and every recorded epoch of each (so the history drafter has earlier epochs
to draw from), chosen in one pass over the files.
"""
from __future__ import annotations

import json
import re
import zlib
from pathlib import Path

from recipe.drafting.bounds import CORPUS_GIB, RAY_ENV_KEY
from recipe.report.load import Run
from recipe.sim.acceptance import Drafter, estimate, group_from_record, markdown, record_lines
from recipe.sim.corpus_limits import EngineLimits, engine_line
from recipe.sim.engine import EngineParams
from recipe.token_record import step_files

MAX_GROUPS = 200
MAX_TEXT_BYTES = 32 * 2**20  # ~5M token ids: about a minute of walking three drafters on one core
DRAFTERS = (
    (Drafter(), "`ROLLOUT_SPECULATIVE=ngram` as shipped (`SHIPPED_NGRAM`)"),
    (Drafter.parse("suffix:own+group"), "what `ROLLOUT_SPECULATIVE=group` drafts from in a first epoch"),
    (Drafter.parse("suffix:own+group+history"), "`ROLLOUT_SPECULATIVE=group` once earlier epochs are known"),
)
SPEC_KEY = "actor_rollout_ref.rollout.engine_kwargs.vllm.speculative_config"
_PROMPT_ID = re.compile(r'^\{"prompt_id":"((?:[^"\\]|\\.)*)"')  # recipe/token_record.py writes it first


def tokens_dir(run: Run) -> Path | None:
    """``<run>/tokens`` when it holds recorded steps."""
    d = run.path / "tokens"
    return d if d.is_dir() and step_files(d) else None


def sample_groups(directory: Path, max_groups: int = MAX_GROUPS, max_bytes: int = MAX_TEXT_BYTES) -> list:
    """The groups of the prompts with the smallest CRC32 of their id (all their epochs) that fit both bounds."""
    kept: dict[str, list[tuple[str, str]]] = {}
    groups = size = 0
    limit = None  # prompts hashing at or above this were dropped, or would be

    def key(pid: str) -> tuple[int, str]:
        return zlib.crc32(pid.encode()), pid

    for where, line in record_lines(directory):
        m = _PROMPT_ID.match(line)
        pid = json.loads(f'"{m[1]}"') if m else str(json.loads(line)["prompt_id"])
        if limit is not None and key(pid) >= limit:
            continue
        kept.setdefault(pid, []).append((where, line))
        groups, size = groups + 1, size + len(line)
        while (groups > max_groups or size > max_bytes) and len(kept) > 1:
            limit = key(max(kept, key=key))
            dropped = kept.pop(limit[1])
            groups, size = groups - len(dropped), size - sum(len(text) for _, text in dropped)
        if groups > max_groups or size > max_bytes:  # one prompt alone past a bound: keep its earliest epochs
            groups, size = groups - 1, size - len(kept[pid].pop()[1])
    return [group_from_record(json.loads(line), where) for lines in kept.values() for where, line in lines]


def drafter_section(runs: list[Run], boot: int = 1000) -> str:
    """The markdown section (empty when no run recorded tokens)."""
    parts = []
    for run in runs:
        directory = tokens_dir(run)
        if directory is None:
            continue
        report = estimate(sample_groups(directory), [d for d, _ in DRAFTERS], boot=boot)
        engine = engine_line(report, run_limits(run))
        parts.append(f"### {run.name}\n\n{markdown(report)}\n\n{_verdict(report)}{' ' + engine if engine else ''}\n")
    if not parts:
        return ""
    names = "; ".join(f"`{d.name}`: {why}" for d, why in DRAFTERS)
    return ("## Speculative drafters on the recorded responses\n\n"
            "Tokens per target step each drafter would give on the run's own recorded responses (`<run>/tokens`, "
            f"`RECORD_TOKENS=1`), over at most {MAX_GROUPS} groups and {MAX_TEXT_BYTES >> 20} MiB of recorded text "
            "per run: the prompts with the smallest hash of their row id, all their recorded epochs (the whole "
            f"record: `python -m recipe.sim.acceptance <run>/tokens`). {names} (over the groups whose prompt has an "
            "earlier recorded epoch). 1.0 means speculation saves nothing; "
            "a drafter pays when it is clearly above 1 (a verify step costs more than a decode step, and drafting "
            "costs CPU, so the speed-up is less than this).\n\n" + "\n".join(parts))


def run_limits(run: Run) -> EngineLimits:
    """The run's own scale where its config says it (n, batch, engines, finished texts kept, the corpus's byte bound
    ``ROLLOUT_SPECULATIVE_CORPUS_GIB``; whether its router keeps homes) and its traces' mean response (plus the
    simulator's prompt), the users' scale for the rest (the dataset's size is not in the config)."""
    v = run.config.values if run.config is not None else {}
    d = EngineLimits()
    gib = v.get(RAY_ENV_KEY, d.corpus_gib)  # the launch sends it as a string (an environment variable)
    try:
        gib = float(gib)
    except (TypeError, ValueError):
        raise ValueError(f"{run.name}: {RAY_ENV_KEY}={gib!r} in its config is not a number of GiB; "
                         f"{CORPUS_GIB} is the corpus's bytes per engine (e.g. 24)") from None
    lengths = run.traces["response_length"] if run.traces is not None and "response_length" in run.traces else None
    text = d.text_tokens if lengths is None or not len(lengths) else float(lengths.mean()) + EngineParams.prompt_len

    def num(key, default):
        x = v.get(key)
        return int(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else default

    tp = num("actor_rollout_ref.rollout.tensor_model_parallel_size", 0)
    gpus = num("trainer.nnodes", 1) * num("trainer.n_gpus_per_node", 0)
    engines = gpus // tp if tp and gpus >= tp else d.engines
    router = str(v.get("actor_rollout_ref.rollout.router_config_path") or "")
    home = None if router.endswith("group_affinity.yaml") or not v else 1 / engines  # None: the router's model
    return EngineLimits(prompts=d.prompts, n=num("actor_rollout_ref.rollout.n", d.n),
                        batch=num("data.train_batch_size", d.batch), engines=engines,
                        kept=num(f"{SPEC_KEY}.suffix_decoding_max_cached_requests", d.kept), home=home,
                        corpus_gib=gib, text_tokens=text)


def _verdict(report: dict) -> str:
    """Which drafter gives the most tokens per step, against the shipped ngram."""
    scored = {name: s["tokens_per_step"] for name, s in report.items() if s.get("tokens_per_step") is not None}
    if not scored:
        return "No drafter had responses to walk."
    best = max(scored, key=scored.get)
    ngram = scored.get(DRAFTERS[0][0].name)
    against = "" if ngram is None or best == DRAFTERS[0][0].name else f" (shipped ngram: {ngram:.2f})"
    return f"Most tokens per target step: `{best}`, {scored[best]:.2f}{against}."
