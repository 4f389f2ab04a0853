"""``python -m recipe.sim``: simulate the GRPO rollout phase under several batch-formation policies.

Prints a markdown table (or, with ``--json``, exactly one JSON object). Ratios use the epochs after the first,
since epoch 0 has no length estimates. Reference run: ``python -m recipe.sim`` (1024 prompts x n=16, 4 epochs,
batch 32, response_length 16384, policies ``DEFAULT_POLICIES``). ``best`` is the project's best policy: length-aware
order + over-sample ``continue`` (partial rollout) bounded by ``max_resumes``, so it trains partly on tokens of the
previous policy version (see the stale columns); ``best-onpolicy`` is the fastest strictly on-policy composition.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from . import trace as T
from .engine import EngineParams, fit_engine
from .policies import POLICIES
from .run import simulate, warm_epochs

DEFAULT_POLICIES = ("baseline,seed,best,best-max-resumes-2,best-onpolicy,oversample-restart,partial-rollout-unbounded,"
                    "oracle")
MOONSHOT_SPEEDUP = 1.5
MOONSHOT_EXTRA_TRUNCATION = 0.01


def _parse_value(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m recipe.sim", description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    ap.add_argument("--trace", default="reference", help=f"{', '.join(T.SHAPES)} or a recorded PATH.jsonl")
    ap.add_argument("--epochs", type=int, help="epochs (generated default 4; a recording: its first N)")
    ap.add_argument("--prompts", type=int, help="prompts (generated default 1024; cut to whole batches)")
    ap.add_argument("--n", type=int, help="responses per prompt (default 16)")
    ap.add_argument("--batch-size", type=int, default=32, help="prompts per step (gen_batch_size)")
    ap.add_argument("--response-length", type=int, help="rollout.response_length (default 16384)")
    ap.add_argument("--policies", default=DEFAULT_POLICIES, help=f"comma list of: {', '.join(POLICIES)}")
    ap.add_argument("--seed", type=int, default=0, help="trace, order and routing seed")
    ap.add_argument("--trace-param", action="append", default=[], metavar="KEY=VALUE",
                    help="override a TraceParams field of a generated trace, e.g. within_sigma=0.3")
    ap.add_argument("--censored-as", choices=T.CENSORED_AS, default="observed",
                    help="replay recorded lower bounds (cap/abort) at their observed length or at the limit")
    d = EngineParams()
    eng = ap.add_argument_group("engine (defaults: Qwen3-30B-A3B, 4 x TP4 replicas, estimates)")
    eng.add_argument("--replicas", type=int, default=d.replicas)
    eng.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs)
    eng.add_argument("--decode-a", type=float, default=d.decode_a, help="s per decode step")
    eng.add_argument("--decode-b", type=float, default=d.decode_b, help="s per running sequence per step")
    eng.add_argument("--decode-c", type=float, default=d.decode_c, help="s per context token per step")
    eng.add_argument("--prefill-tok-s", type=float, default=d.prefill_tok_s, help="s per prefilled token")
    eng.add_argument("--prompt-len", type=int, default=d.prompt_len)
    eng.add_argument("--fit-engine", action="store_true",
                     help="fit decode a, b on the recorded trace's gen_time_s (sets c and prefill to 0)")
    ap.add_argument("--record", metavar="DIR",
                    help="write each policy's steps (baseline included) as DIR/<policy>.jsonl, trainer format")
    return ap


def load_trace(args) -> T.Trace:
    overrides = {k: v for k, v in (("epochs", args.epochs), ("num_prompts", args.prompts), ("n", args.n),
                                   ("response_length", args.response_length), ("seed", args.seed)) if v is not None}
    for item in args.trace_param:
        key, _, value = item.partition("=")
        if key not in {f.name for f in dataclasses.fields(T.TraceParams)}:
            raise SystemExit(f"--trace-param {item!r}: {key!r} is not a TraceParams field")
        overrides[key] = _parse_value(value)
    if args.trace in T.SHAPES:
        return T.generate(args.trace, **overrides)
    if args.trace_param:
        raise SystemExit("--trace-param applies to generated traces only")
    overrides.pop("seed")
    return T.load(args.trace, censored_as=args.censored_as, **overrides)


def engine_params(args) -> tuple[EngineParams, dict | None]:
    p = EngineParams(replicas=args.replicas, max_num_seqs=args.max_num_seqs, decode_a=args.decode_a,
                     decode_b=args.decode_b, decode_c=args.decode_c, prefill_tok_s=args.prefill_tok_s,
                     prompt_len=args.prompt_len)
    if not args.fit_engine:
        return p, None
    if args.trace in T.SHAPES:
        raise SystemExit("--fit-engine needs a recorded trace")
    fit = fit_engine(T.engine_records(args.trace), replicas=p.replicas)
    return dataclasses.replace(p, **{k: fit[k] for k in ("decode_a", "decode_b", "decode_c", "prefill_tok_s")}), fit


def goals(policies: list[dict]) -> dict:
    by = {p["name"]: p for p in policies}
    out: dict = {}
    if "best" in by and "seed" in by:
        best, seed = by["best"], by["seed"]
        out["best_minus_seed_speedup"] = round(best["speedup_vs_baseline"] - seed["speedup_vs_baseline"], 4)
        out["best_beats_seed_by_0.1"] = out["best_minus_seed_speedup"] >= 0.1
        out["best_truncates_no_more_than_seed"] = best["truncated_fraction"] <= seed["truncated_fraction"]
        out["best_trains_every_prompt_once"] = best["every_prompt_once_per_epoch"]
        out["best_max_policy_versions"] = best["max_policy_versions"]
        out["best_stale_token_fraction"] = best["stale_token_fraction"]
        out["policies_meeting_the_best_goal"] = [
            p["name"] for p in policies
            if p["name"] != "oracle" and p["speedup_vs_baseline"] - seed["speedup_vs_baseline"] >= 0.1
            and p["truncated_fraction"] <= seed["truncated_fraction"] and p["every_prompt_once_per_epoch"]]
    limit = by["baseline"]["truncated_fraction"] + MOONSHOT_EXTRA_TRUNCATION
    real = [p for p in policies if p["name"] != "oracle" and p["truncated_fraction"] <= limit]
    top = max(real, key=lambda p: p["speedup_vs_baseline"])
    out["moonshot"] = {"target_speedup": MOONSHOT_SPEEDUP, "max_truncated_fraction": round(limit, 5),
                       "closest_policy": top["name"], "speedup": top["speedup_vs_baseline"],
                       "gap": round(MOONSHOT_SPEEDUP - top["speedup_vs_baseline"], 4),
                       "closest_max_policy_versions": top["max_policy_versions"],
                       "closest_stale_token_fraction": top["stale_token_fraction"]}
    onpolicy = [p for p in real if p["max_policy_versions"] == 1]
    if onpolicy:
        top_on = max(onpolicy, key=lambda p: p["speedup_vs_baseline"])
        out["moonshot"].update(closest_onpolicy_policy=top_on["name"], onpolicy_speedup=top_on["speedup_vs_baseline"])
    return out


def markdown(report: dict) -> str:
    tr, warm = report["trace"], report["warm_epochs"]
    lines = [f"trace `{tr['name']}`: {tr['num_prompts']} prompts x n={tr['n']}, {tr['epochs']} epochs, "
             f"response_length {tr['response_length']}, batch {report['batch_size']}; mean length per epoch "
             f"{tr['summary']['mean_length_per_epoch']}, truncated at the limit "
             f"{tr['summary']['truncated_fraction_per_epoch']}",
             f"engine: {report['engine']}",
             f"ratios and per-step figures over epochs {warm}; any-order no-cap lower bound "
             f"{report['lower_bound_s']} s",
             "",
             "| policy | speedup vs baseline | time / oracle | time / lower bound | epoch times (s)"
             " | step p50 / p95 / max (s) | tokens/s | truncated | capped | trained mean length | wasted tokens"
             " | resumed responses | stale tokens | max versions | prompts trained per epoch |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in report["policies"]:
        lines.append(
            f"| {p['name']} | {p['speedup_vs_baseline']:.3f} | {p['time_vs_oracle'] or '-'} | "
            f"{p['time_vs_lower_bound']:.2f} | {' / '.join(f'{t:.0f}' for t in p['epoch_times_s'])} | "
            f"{p['step_time_p50_s']:.0f} / {p['step_time_p95_s']:.0f} / {p['step_time_max_s']:.0f} | "
            f"{p['tokens_per_s']:.0f} | {100 * p['truncated_fraction']:.2f}% | {100 * p['capped_fraction']:.2f}% | "
            f"{p['trained_mean_length']:.0f} | {100 * p['wasted_tokens_fraction']:.1f}% | "
            f"{100 * p['resumed_response_fraction']:.0f}% | {100 * p['stale_token_fraction']:.1f}% | "
            f"{p['max_policy_versions']} | {p['prompts_trained_per_epoch']} |")
    g = report["goals"]
    lines.append("")
    if "best_minus_seed_speedup" in g:
        lines.append(f"- best - seed speedup: {g['best_minus_seed_speedup']:+.3f} (goal >= +0.1: "
                     f"{'met' if g['best_beats_seed_by_0.1'] else 'NOT met'}); best truncates no more than seed: "
                     f"{g['best_truncates_no_more_than_seed']}; every prompt once per epoch: "
                     f"{g['best_trains_every_prompt_once']}; best trains on up to {g['best_max_policy_versions']}"
                     f" policy versions per response, {100 * g['best_stale_token_fraction']:.1f}% of its trained "
                     f"tokens from an older policy; policies meeting that goal: "
                     f"{', '.join(g['policies_meeting_the_best_goal']) or 'none'}")
    m = g["moonshot"]
    lines.append(f"- moonshot {m['target_speedup']}x at truncation <= {100 * m['max_truncated_fraction']:.2f}%: "
                 f"closest "
                 f"{m['closest_policy']} at {m['speedup']:.3f}x (gap {m['gap']:+.3f}; trains on up to "
                 f"{m['closest_max_policy_versions']} policy versions per response, "
                 f"{100 * m['closest_stale_token_fraction']:.1f}% stale tokens)"
                 + (f"; closest strictly on-policy: {m['closest_onpolicy_policy']} at {m['onpolicy_speedup']:.3f}x"
                    if "closest_onpolicy_policy" in m else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    names = [s.strip() for s in args.policies.split(",") if s.strip()]
    unknown = [nm for nm in names if nm not in POLICIES]
    if unknown:
        raise SystemExit(f"unknown policies {unknown}; known: {', '.join(POLICIES)}")
    trace = load_trace(args)
    engine, fit = engine_params(args)
    res = simulate(trace, names, engine, batch_size=args.batch_size, seed=args.seed, record_dir=args.record)
    trace = res["trace"]
    report = {
        "trace": {"name": trace.name, "num_prompts": trace.num_prompts, "n": trace.n, "epochs": trace.epochs,
                  "response_length": trace.response_length, "params": trace.params, "summary": trace.summary()},
        "engine": {**engine.to_dict(), **({"fit": fit} if fit else {})},
        "batch_size": args.batch_size,
        "seed": args.seed,
        "warm_epochs": warm_epochs(trace.epochs),
        "lower_bound_s": res["lower_bound_s"],
        "policies": res["policies"],
        "goals": goals(res["policies"]),
    }
    if args.json:
        json.dump(report, sys.stdout)
        sys.stdout.write("\n")
    else:
        print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
