"""Command line: ``scripts/compare_runs.sh RUN_A RUN_B [--out DIR] [--names A,B]`` (or ``python -m recipe.report``).

Prints which config keys differ (warning about any outside the arms' own switches), then the markdown table (and,
for runs that recorded their token ids, the speculative drafters' estimate: ``recipe/report/drafters.py``), and
writes them, with the PNG plots, to a directory of its own (default ``./compare_<A>_vs_<B>/``) so a report never
writes into, or over, a run's data.
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path

from recipe.report.drafters import drafter_section
from recipe.report.load import RunLogsError, load_run
from recipe.report.plots import write_plots
from recipe.report.run_config import render_config_diff
from recipe.report.summary import compare, render_markdown, render_sources

RUN_HELP = "a run directory (searched recursively for verl file-logger *.jsonl and length traces) or one .jsonl file"
RUN_FIX = (
    "pass a run directory holding verl's file-logger JSONL (trainer.logger must include 'file'), or the .jsonl itself"
)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "run"


def _parser(prog: str | None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Compare two GRPO runs (A = baseline, B = candidate).")
    p.add_argument("run_a", metavar="RUN_A", help=RUN_HELP)
    p.add_argument("run_b", metavar="RUN_B", help=RUN_HELP)
    p.add_argument("--out", metavar="DIR", type=Path, help="output directory (default: ./compare_<A>_vs_<B>/)")
    p.add_argument("--names", metavar="A,B", help="display names for the two runs (default: their directory names)")
    return p


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Run the comparison; returns 0, or exits with status 2 and a message naming the bad argument."""
    parser = _parser(prog)
    args = parser.parse_args(argv)
    names = (None, None)
    if args.names is not None:
        names = tuple(n.strip() for n in args.names.split(","))
        if len(names) != 2 or not all(names):
            parser.error(f"--names: expected two comma-separated names, e.g. --names base,capped; got {args.names!r}")
    runs = []
    for label, path, name in (("RUN_A", args.run_a, names[0]), ("RUN_B", args.run_b, names[1])):
        try:
            runs.append(load_run(path, name))
        except RunLogsError as e:
            parser.error(f"{label}: {e}; {RUN_FIX}")
    a, b = runs
    if a.name == b.name and args.names is None:
        a.name, b.name = f"{a.name}_A", f"{b.name}_B"
    out = args.out or Path(f"compare_{_safe(a.name)}_vs_{_safe(b.name)}")
    config = render_config_diff(a.config, b.config, (a.name, b.name))
    table = render_markdown(compare(a, b), (a.name, b.name))
    sources = render_sources(runs)
    paths = write_plots(runs, out)
    drafters = drafter_section(runs)
    report = f"# {b.name} vs {a.name}\n\n{config}\n## Metrics\n\n{table}\n"
    if drafters:  # only where a run recorded its token ids (RECORD_TOKENS=1)
        report += f"{drafters}\n"
    report += f"## Sources\n\n{sources}"
    (out / "compare.md").write_text(report)
    print(config)
    print(table)
    if drafters:
        print(drafters)
    print(sources)
    print(f"Wrote {out / 'compare.md'} and {', '.join(str(p) for p in paths.values())}")
    return 0
