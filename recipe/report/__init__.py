"""Compare two runs from their logs: verl's file-logger metrics, the recipe's length traces and Hydra's record of
each run's config.

Entry points: ``scripts/compare_runs.sh`` / ``python -m recipe.report`` (``cli.main``), or from Python
``load_run`` -> ``render_config_diff``, ``compare`` -> ``render_markdown``, ``drafter_section`` and ``write_plots``.
"""
from recipe.report.cli import main
from recipe.report.drafters import drafter_section
from recipe.report.load import Run, RunLogsError, find_logs, load_run, read_metrics
from recipe.report.plots import (
    plot_cap,
    plot_mismatch,
    plot_speculation,
    plot_response_lengths,
    plot_times,
    plot_val_score,
    write_plots,
)
from recipe.report.run_config import RunConfig, diff, find_config, is_arm_switch, render_config_diff
from recipe.report.summary import (
    Row,
    cap_per_step,
    compare,
    cumulative_time,
    render_markdown,
    render_sources,
    summarize,
    truncation,
    val_curve,
)

__all__ = [
    "Row",
    "Run",
    "RunConfig",
    "RunLogsError",
    "cap_per_step",
    "compare",
    "cumulative_time",
    "diff",
    "drafter_section",
    "find_config",
    "find_logs",
    "is_arm_switch",
    "load_run",
    "main",
    "plot_cap",
    "plot_mismatch",
    "plot_speculation",
    "plot_response_lengths",
    "plot_times",
    "plot_val_score",
    "read_metrics",
    "render_config_diff",
    "render_markdown",
    "render_sources",
    "summarize",
    "truncation",
    "val_curve",
    "write_plots",
]
