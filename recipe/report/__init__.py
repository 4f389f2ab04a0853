"""Compare two runs from their logs: verl's file-logger metrics plus the recipe's length traces.

Entry points: ``scripts/compare_runs.sh`` / ``python -m recipe.report`` (``cli.main``), or from Python
``load_run`` -> ``compare`` -> ``render_markdown`` and ``write_plots``.
"""
from recipe.report.cli import main
from recipe.report.load import Run, RunLogsError, find_logs, load_run, read_metrics
from recipe.report.plots import plot_cap, plot_response_lengths, plot_times, write_plots
from recipe.report.summary import Row, cap_per_step, compare, render_markdown, render_sources, summarize, truncation

__all__ = [
    "Row",
    "Run",
    "RunLogsError",
    "cap_per_step",
    "compare",
    "find_logs",
    "load_run",
    "main",
    "plot_cap",
    "plot_response_lengths",
    "plot_times",
    "read_metrics",
    "render_markdown",
    "render_sources",
    "summarize",
    "truncation",
    "write_plots",
]
