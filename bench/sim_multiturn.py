"""Multi-turn (tool-calling) rollouts in the simulator (issue 18 items 6-7): baseline, the seed, the tail cut,
over-sample ``restart`` and ``continue``, and ordering by tokens vs by expected time, on the multi-turn reference
shape (tuned) and a held-out shape (not tuned on), on trace seeds that took no part in the tuning.

Reproduce: ``.venv/bin/python bench/sim_multiturn.py --results bench/RESULTS.md`` (~3 minutes on 2 shared cores;
without ``--results`` it only prints). The section goes between the ``sim_multiturn`` markers.

Tuning (``mt-reference`` only, trace seeds 10-11): the over-sample ratio of ``restart`` and of ``continue`` and the
time key's ``tokens_per_s``, each the fastest of a small grid by mean speedup (the tail cut keeps its single-turn
knobs, 0.975 and level exponent 1.25, untuned). Report: trace seeds 0-2 on ``mt-reference`` and ``mt-heldout``.
Model and assumptions: ``recipe/sim/multiturn/``. Speedups over ``baseline`` on epochs 1-3.
"""

import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from recipe.report.sections import section_main  # noqa: E402
from recipe.sim import multiturn as M  # noqa: E402
from recipe.sim.engine import EngineParams  # noqa: E402

COMMAND = ".venv/bin/python bench/sim_multiturn.py --results bench/RESULTS.md"
MARK_START, MARK_END = "<!-- sim_multiturn:start -->", "<!-- sim_multiturn:end -->"
HEADING = "## Multi-turn rollouts (bench/sim_multiturn.py)"
LABELS = {"baseline": "baseline (random order)", "seed": "seed (order + cap)",
          "tailcut-level": "tail cut (`tailcut-level`, by tokens)", "oversample-restart": "over-sample `restart`",
          "oversample-continue": "over-sample `continue` (off-policy)",
          "order-tokens": "order by tokens (warm, no cut)",
          "order-time": "order by expected time (warm, no cut)",
          "tailcut-level-time": "tail cut, order by expected time"}


@dataclass
class Config:
    shapes: tuple = ("mt-reference", "mt-heldout")
    tuning_shape: str = "mt-reference"
    tuning_seeds: tuple = (10, 11)
    report_seeds: tuple = (0, 1, 2)
    restart_ratios: tuple = (0.125, 0.25, 0.5)
    continue_ratios: tuple = (0.5, 1.0)
    tokens_per_s: tuple = (30.0, 60.0, 120.0, 240.0)
    trace: dict = field(default_factory=dict)  # MTShape overrides (tests: a small trace)
    batch_size: int = 32


ENGINE = EngineParams(kv_tokens=None)  # the multi-turn engine has no KV model


def _runs(cfg: Config, shape: str, seed: int, names, reprefill: str = "full") -> dict[str, dict]:
    tr = M.generate_mt(shape, seed=seed, **cfg.trace)
    out = M.simulate_mt(tr, list(names), ENGINE, batch_size=cfg.batch_size, seed=seed, reprefill=reprefill)
    base = out[0]["truncated_fraction"]
    return {e["name"]: {**e, "extra": e["truncated_fraction"] - base} for e in out}


def tune(cfg: Config) -> tuple[dict, list[str]]:
    """Each tuned knob's grid on the tuning seeds; registers the choice under the standard names."""
    cands = {}
    for r in cfg.restart_ratios:
        cands[f"tune-restart-{r}"] = ("oversample-restart", dict(oversample_ratio=r), None)
    for r in cfg.continue_ratios:
        cands[f"tune-continue-{r}"] = ("oversample-continue", dict(oversample_ratio=r), None)
    for v in cfg.tokens_per_s:
        cands[f"tune-time-{v:g}"] = ("order-time", {}, M.MTOptions("time", v))
    for nm, (base, kw, opts) in cands.items():
        spec, o = M.MT_POLICIES[base]
        M.register_mt(nm, dataclasses.replace(spec, **kw), opts or o)
    res = {nm: [] for nm in cands}
    for seed in cfg.tuning_seeds:
        got = _runs(cfg, cfg.tuning_shape, seed, cands)
        for nm in cands:
            res[nm].append(got[nm])
    mean = {nm: (float(np.mean([e["speedup_vs_baseline"] for e in v])), float(np.mean([e["extra"] for e in v])))
            for nm, v in res.items()}
    lines = ["| knob | value | mean speedup (tuning seeds) | mean extra truncation (points) |", "|---|---|---|---|"]
    chosen = {}
    for knob, prefix in (("over-sample ratio, restart", "tune-restart-"), ("over-sample ratio, continue",
                                                                          "tune-continue-"),
                         ("time key tokens_per_s", "tune-time-")):
        group = [nm for nm in cands if nm.startswith(prefix)]
        best = max(group, key=lambda nm: mean[nm][0])
        for nm in group:
            mark = " **chosen**" if nm == best else ""
            lines.append(f"| {knob} | {nm[len(prefix):]}{mark} | {mean[nm][0]:.3f} | {100 * mean[nm][1]:+.2f} |")
        chosen[knob] = float(best[len(prefix):])
    for nm in cands:
        del M.MT_POLICIES[nm]
    spec, o = M.MT_POLICIES["oversample-restart"]
    M.register_mt("oversample-restart", dataclasses.replace(spec, oversample_ratio=chosen["over-sample ratio, "
                                                                                           "restart"]), o)
    spec, o = M.MT_POLICIES["oversample-continue"]
    M.register_mt("oversample-continue", dataclasses.replace(spec, oversample_ratio=chosen["over-sample ratio, "
                                                                                            "continue"]), o)
    tps = chosen["time key tokens_per_s"]
    for nm in ("order-time", "tailcut-level-time"):
        spec, _ = M.MT_POLICIES[nm]
        M.register_mt(nm, spec, M.MTOptions("time", tps))
    return chosen, lines


def section(cfg: Config | None = None) -> str:
    cfg = cfg or Config()
    t_shape = M.MTShape(**{**M.MT_SHAPES["mt-reference"], **cfg.trace})
    chosen, tune_lines = tune(cfg)
    names = M.MT_DEFAULT_POLICIES
    lines = [f"Reproduce: `{COMMAND}`; one shape and seed: `.venv/bin/python -m recipe.sim.multiturn --shape "
             "mt-heldout --seed 0`. Model, assumptions and what it leaves out: `recipe/sim/multiturn/`. "
             f"{t_shape.num_prompts} prompts x n={t_shape.n}, {t_shape.epochs} epochs, batch {cfg.batch_size}, "
             f"response_length {t_shape.response_length} (assistant + tool tokens), 4 replicas, the engine's decode "
             "and prefill parameters, KV dropped during a tool call (whole context re-prefilled on return).", ""]
    for shape in cfg.shapes:
        s = M.generate_mt(shape, seed=cfg.report_seeds[0], **cfg.trace).summary()
        lines.append(f"- `{shape}` (seed {cfg.report_seeds[0]}): mean {s['mean_tokens']:.0f} tokens per trajectory, "
                     f"{100 * s['truncated_fraction']:.1f}% at the limit, {s['mean_tool_calls']:.2f} tool calls, "
                     f"{s['mean_tool_latency_s']:.2f} s per call, {s['mean_tool_seconds_per_trajectory']:.1f} s of "
                     "tools per trajectory")
    lines += ["", f"Tuning (`{cfg.tuning_shape}`, trace seeds {', '.join(map(str, cfg.tuning_seeds))}; the held-out "
              "shape takes no part):", "", *tune_lines, ""]
    table = {}
    for shape in cfg.shapes:
        for seed in cfg.report_seeds:
            table[(shape, seed)] = _runs(cfg, shape, seed, names)
    seeds_txt = " / ".join(map(str, cfg.report_seeds))
    lines += [f"Report (trace seeds {', '.join(map(str, cfg.report_seeds))}; speedup over baseline on epochs 1+; "
              "extra truncation over baseline in points; stale: trained tokens from an older policy; wasted: decoded "
              "tokens thrown away; re-prefill: prefilled tokens of trajectories back from a tool per decoded "
              "token):", "",
              f"| shape | policy | speedup (seeds {seeds_txt}) | mean | extra truncation (mean) | stale tokens | "
              "wasted tokens | re-prefill per decoded token | every prompt once per epoch |",
              "|---|---|---|---|---|---|---|---|---|"]
    means = {}
    for shape in cfg.shapes:
        for nm in names:
            es = [table[(shape, s)][nm] for s in cfg.report_seeds]
            sp = float(np.mean([e["speedup_vs_baseline"] for e in es]))
            means[(shape, nm)] = sp
            lines.append(
                f"| {shape}{' (held out)' if shape != cfg.tuning_shape else ''} | {LABELS.get(nm, nm)} | "
                f"{' / '.join(format(e['speedup_vs_baseline'], '.3f') for e in es)} | {sp:.3f} | "
                f"{100 * np.mean([e['extra'] for e in es]):+.2f} | "
                f"{100 * np.mean([e['stale_token_fraction'] for e in es]):.1f}% | "
                f"{100 * np.mean([e['wasted_tokens_fraction'] for e in es]):.1f}% | "
                f"{np.mean([e['reprefill_per_decoded'] for e in es]):.2f} | "
                f"{all(e['every_prompt_once_per_epoch'] for e in es)} |")
    diffs = {shape: (means[(shape, "order-time")] - means[(shape, "order-tokens")],
                     means[(shape, "tailcut-level-time")] - means[(shape, "tailcut-level")]) for shape in cfg.shapes}
    better = all(a > 0 and b > 0 for a, b in diffs.values())
    lines += ["", "Ordering by expected time minus ordering by tokens (mean speedup; no cut / with the tail cut): "
              + "; ".join(f"`{s}` {a:+.3f} / {b:+.3f}" for s, (a, b) in diffs.items())
              + f". Default by this: `{'time' if better else 'tokens'}` (time only if it wins on every shape and both "
              "families)."]
    sens = _runs(cfg, cfg.tuning_shape, cfg.report_seeds[0], ["tailcut-level", "order-time"], reprefill="new")
    full = table[(cfg.tuning_shape, cfg.report_seeds[0])]
    lines += ["", f"Sensitivity (`{cfg.tuning_shape}`, seed {cfg.report_seeds[0]}): the KV kept through the tool "
              "call (`reprefill=\"new\"`: only the tool output prefilled on return) instead of the whole context: "
              + "; ".join(f"{nm} {full[nm]['speedup_vs_baseline']:.3f} -> {sens[nm]['speedup_vs_baseline']:.3f}"
                          for nm in ("tailcut-level", "order-time"))
              + f" (speedups over each run's own baseline; re-prefill per decoded token "
              f"{full['baseline']['reprefill_per_decoded']:.2f} -> {sens['baseline']['reprefill_per_decoded']:.2f})."]
    lines.append("")
    lines.append("Chosen on the tuning seeds: " + "; ".join(f"{k} {v:g}" for k, v in chosen.items())
                 + f" (the registered multi-turn policies: restart {M.MT_RESTART_RATIO:g}, continue "
                 f"{M.MT_CONTINUE_RATIO:g}, tokens_per_s {M.MT_TOKENS_PER_S:g}).")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return section_main(__doc__, section, MARK_START, MARK_END, HEADING, argv)


if __name__ == "__main__":
    sys.exit(main())
