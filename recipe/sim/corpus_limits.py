"""What the group drafter's engine can reach of a prompt's history, so the estimator's figure is the engine's.

``python -m recipe.sim.acceptance`` walks ``suffix:own+group+history`` with every earlier epoch of a prompt at hand:
one corpus, unlimited. The engine (``ROLLOUT_SPECULATIVE=group``, ``recipe/drafting``) keeps one corpus per vLLM
engine and at most ``kept`` finished texts in it (``ROLLOUT_SPECULATIVE_SUFFIX_CACHED``, FIFO), and a group finds its
prompt's previous group only

- where the router sent it to an engine that ran the prompt before (``recipe/adapter/router.py``: homes, and a load
  guard that moves or splits a group; ``recipe.sim.routing.home_share`` models it at the run's prompts, n, batch and
  engines: ~94% of a later epoch's responses at the users' scale; 1/engines for a router that does not keep homes),
  and
- while that group is still in the engine's corpus. The corpus keeps each prompt's latest group (n texts) and at
  most ``kept`` finished texts in all: when ``kept / n`` covers the engine's share of the prompts, every home
  prompt's history lasts until it comes back; otherwise the oldest go first, an engine finishes ``batch * n /
  engines`` texts a step, and a prompt comes back after ``S - U1 + U2`` steps (S steps an epoch, U1 and U2 its
  places in two shuffled epochs, uniform): triangular on [0, 2S], so a corpus holding ``h`` steps keeps the
  history of ``(h/S)^2 / 2`` of the groups for h <= S, ``1 - (2 - h/S)^2 / 2`` above.

The rest draft from their own context and running group only, so the engine's tokens per step is the mix of the
estimator's own + group and own + group + history figures at that share (:func:`engine_tokens_per_step`). Left out:
a history older than one epoch (the walk uses every recorded epoch; the engine keeps at most what fits), and the
running siblings a split group loses (its own + group figure is taken whole).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .routing import home_share


@lru_cache(maxsize=16)
def router_home(prompts: int, n: int, batch: int, engines: int) -> float:
    """Share of a later epoch's responses the router sends where their prompt ran before (``recipe.sim.routing``)."""
    return round(home_share(prompts, n, batch, engines)["history"], 4)


@dataclass(frozen=True)
class EngineLimits:
    """The run's scale: ``prompts`` in the dataset, ``n`` responses each, ``batch`` prompts a step, ``engines`` vLLM
    engines (replicas), ``kept`` finished texts per engine, ``home`` the share of responses routed to an engine that ran
    their prompt before (None: the recipe's router at this scale, ``router_home``). Defaults: the users' scale
    (DAPO-Math-17k de-duplicated, 2 x 8 GPUs as 4 x TP4, the preflight's defaults for group)."""

    prompts: int = 17408
    n: int = 16
    batch: int = 32
    engines: int = 4
    kept: int = 80000
    home: float | None = None

    def __post_init__(self):
        if min(self.prompts, self.n, self.batch, self.engines) < 1 or self.kept < 0 or not 0 <= (self.home or 0) <= 1:
            raise ValueError(f"engine limits need prompts, n, batch, engines >= 1, kept >= 0 and home in [0, 1]: "
                             f"{self}")
        if self.home is None:
            object.__setattr__(self, "home", router_home(self.prompts, self.n, min(self.batch, self.prompts),
                                                         self.engines))

    @property
    def history_steps(self) -> float:
        """Steps of an engine's finished texts its corpus holds."""
        return self.kept / (self.batch * self.n / self.engines)

    @property
    def kept_share(self) -> float:
        """Share of a later epoch's groups whose prompt's previous group is still in its engine's corpus."""
        if self.kept / self.n >= self.prompts / self.engines:  # one group per prompt an engine serves fits
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
            f"{limits.engines} engines keeping {limits.kept} finished texts each: {limits.history_steps:.0f} steps of "
            f"history, {limits.kept_share:.1%} of groups still in the corpus x {limits.home:.1%} routed home = "
            f"{limits.history_share:.1%}; `recipe/sim/corpus_limits.py`) `ROLLOUT_SPECULATIVE=group` reaches "
            f"**{engine:.3f}** tokens per step in a later epoch, against {with_history:.3f} with unlimited history "
            f"and {without:.3f} without.")
