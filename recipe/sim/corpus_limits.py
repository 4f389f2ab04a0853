"""What the group drafter's engine can reach of a prompt's history, so the estimator's figure is the engine's.

``python -m recipe.sim.acceptance`` walks ``suffix:own+group+history`` with every earlier epoch of a prompt at hand:
one corpus, unlimited. The engine (``ROLLOUT_SPECULATIVE=group``, ``recipe/drafting``) keeps one corpus per vLLM
engine and in it at most ``kept`` finished texts (``ROLLOUT_SPECULATIVE_SUFFIX_CACHED``, FIFO) and at most
``corpus_gib`` GiB (``ROLLOUT_SPECULATIVE_CORPUS_GIB``, oldest first): whichever holds fewer texts binds, a text
costing the preflight's bytes per token (``recipe/preflight/rollout.py``, the measured worst case after eviction)
times the workload's mean text (prompt + response) in tokens. A group finds its prompt's previous group only

- where the router sent it to an engine that ran the prompt before (``recipe/adapter/router.py``: homes, and a load
  guard that moves or splits a group; ``recipe.sim.routing.home_share`` models it at the run's prompts, n, batch and
  engines: ~94% of a later epoch's responses at the users' scale; 1/engines for a router that does not keep homes),
  and
- while that group is still in the engine's corpus. The corpus keeps each prompt's latest group (n texts) and at
  most ``kept_texts`` finished texts in all: when ``kept_texts / n`` covers the engine's share of the prompts, every
  home prompt's history lasts until it comes back; otherwise the oldest go first, an engine finishes ``batch * n /
  engines`` texts a step, and a prompt comes back after ``S - U1 + U2`` steps (S steps an epoch, U1 and U2 its
  places in two shuffled epochs, uniform): triangular on [0, 2S], so a corpus holding ``h`` steps keeps the
  history of ``(h/S)^2 / 2`` of the groups for h <= S, ``1 - (2 - h/S)^2 / 2`` above.

The rest draft from their own context and running group only, so the engine's tokens per step is the mix of the
estimator's own + group and own + group + history figures at that share (:func:`engine_tokens_per_step`). Left out:
a history older than one epoch (the walk uses every recorded epoch; the engine keeps at most what fits), the
running siblings a split group loses (its own + group figure is taken whole), and the running texts' share of the
byte bound (one step's, ~1% of the default's at the users' scale).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..drafting.bounds import CORPUS_GIB, DEFAULT_CORPUS_GIB
from ..preflight.rollout import GROUP_BYTES_PER_TOKEN
from .engine import EngineParams
from .routing import home_share
from .trace import TraceParams

# the users' mean text: the reference trace's epoch-0 mean response and the engine's prompt, in tokens
USERS_TEXT_TOKENS = TraceParams.target_mean + EngineParams.prompt_len


@lru_cache(maxsize=16)
def router_home(prompts: int, n: int, batch: int, engines: int) -> float:
    """Share of a later epoch's responses the router sends where their prompt ran before (``recipe.sim.routing``)."""
    return round(home_share(prompts, n, batch, engines)["history"], 4)


@dataclass(frozen=True)
class EngineLimits:
    """The run's scale: ``prompts`` in the dataset, ``n`` responses each, ``batch`` prompts a step, ``engines`` vLLM
    engines (replicas), ``kept`` finished texts per engine, ``home`` the share of responses routed to an engine that ran
    their prompt before (None: the recipe's router at this scale, ``router_home``), ``corpus_gib`` the byte bound per
    engine and ``text_tokens`` the mean text (prompt + response) it holds. Defaults: the users' scale (DAPO-Math-17k
    de-duplicated, 2 x 8 GPUs as 4 x TP4, ~6k-token responses, the preflight's defaults for group)."""

    prompts: int = 17408
    n: int = 16
    batch: int = 32
    engines: int = 4
    kept: int = 80000
    home: float | None = None
    corpus_gib: float = DEFAULT_CORPUS_GIB
    text_tokens: float = USERS_TEXT_TOKENS

    def __post_init__(self):
        if (min(self.prompts, self.n, self.batch, self.engines) < 1 or self.kept < 0 or self.corpus_gib < 0
                or not self.text_tokens >= 1 or not 0 <= (self.home or 0) <= 1):
            raise ValueError(f"engine limits need prompts, n, batch, engines >= 1, kept >= 0, corpus_gib >= 0 "
                             f"({CORPUS_GIB}), text_tokens >= 1 and home in [0, 1]: {self}")
        if self.home is None:
            object.__setattr__(self, "home", router_home(self.prompts, self.n, min(self.batch, self.prompts),
                                                         self.engines))

    @property
    def byte_texts(self) -> int:
        """Finished texts of the mean length the byte bound holds."""
        return int(self.corpus_gib * 2**30 // (GROUP_BYTES_PER_TOKEN * self.text_tokens))

    @property
    def kept_texts(self) -> int:
        """Finished texts an engine's corpus holds: the smaller of the two bounds."""
        return min(self.kept, self.byte_texts)

    @property
    def binding(self) -> str:
        """The bound that sets ``kept_texts``, as the preflight names it."""
        return "ROLLOUT_SPECULATIVE_SUFFIX_CACHED" if self.kept <= self.byte_texts else CORPUS_GIB

    @property
    def history_steps(self) -> float:
        """Steps of an engine's finished texts its corpus holds."""
        return self.kept_texts / (self.batch * self.n / self.engines)

    @property
    def bound_line(self) -> str:
        """Which bound binds and the texts it leaves, for a summary."""
        return (f"{self.kept_texts} texts kept per engine ({self.binding} binds: ROLLOUT_SPECULATIVE_SUFFIX_CACHED="
                f"{self.kept}, {CORPUS_GIB}={self.corpus_gib:g} GiB at {GROUP_BYTES_PER_TOKEN} B per token x "
                f"{self.text_tokens:.0f} tokens a text)")

    @property
    def kept_share(self) -> float:
        """Share of a later epoch's groups whose prompt's previous group is still in its engine's corpus."""
        if self.kept_texts / self.n >= self.prompts / self.engines:  # one group per prompt an engine serves fits
            return 1.0
        x = min(max(self.history_steps / (self.prompts / self.batch), 0.0), 2.0)
        return x * x / 2 if x <= 1 else 1 - (2 - x) ** 2 / 2

    @property
    def history_share(self) -> float:
        return self.home * self.kept_share


def engine_tokens_per_step(with_history: float, without: float, limits: EngineLimits) -> float:
    """Tokens per target step the engine reaches in a later epoch: the history figure where the history is there."""
    share = limits.history_share
    return share * with_history + (1 - share) * without


def engine_line(report: dict, limits: EngineLimits) -> str:
    """One markdown sentence for an acceptance report holding ``suffix:own+group`` and ``suffix:own+group+history``
    (any k/depth); empty when it lacks either."""
    def find(sources: str):
        for name, s in report.items():
            if name.split(":")[:2] == ["suffix", sources] and s.get("tokens_per_step") is not None:
                return s["tokens_per_step"]
        return None

    with_history, without = find("own+group+history"), find("own+group")
    if with_history is None or without is None:
        return ""
    engine = engine_tokens_per_step(with_history, without, limits)
    return (f"Under the engine's limits ({limits.prompts} prompts, n={limits.n}, {limits.batch} a step, "
            f"{limits.engines} engines keeping {limits.kept_texts} finished texts each, {limits.binding} binding "
            f"({limits.kept} texts, {limits.corpus_gib:g} GiB at {limits.text_tokens:.0f} tokens a text): "
            f"{limits.history_steps:.0f} steps of history, {limits.kept_share:.1%} of groups still in the corpus x "
            f"{limits.home:.1%} routed home = "
            f"{limits.history_share:.1%}; `recipe/sim/corpus_limits.py`) `ROLLOUT_SPECULATIVE=group` reaches "
            f"**{engine:.3f}** tokens per step in a later epoch, against {with_history:.3f} with unlimited history "
            f"and {without:.3f} without.")
