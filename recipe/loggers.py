"""``LOGGER``: where the run's metrics go, in one variable.

``wandb``: Weights & Biases online (needs ``WANDB_API_KEY`` or a ``wandb login``; project ``PROJECT_NAME``, run
``EXPERIMENT_NAME``); ``wandb-offline``: a wandb run written into the run directory (``wandb sync`` uploads it
later); ``console``: verl's metrics line per step in the console log, no wandb; ``off``: neither. verl's ``file``
logger (the run's ``logs/metrics.*.jsonl``, which the A/B report reads) stays in every case; ``TRAINER_LOGGER``
lists the other verl loggers, and LOGGER decides whether ``wandb`` and ``console`` are among them.
"""
from __future__ import annotations

import netrc
import os
from collections.abc import Mapping

LOGGERS = ("wandb", "wandb-offline", "console", "off")
WANDB_MODES = {"wandb": "online", "wandb-offline": "offline", "console": "disabled", "off": "disabled"}


def default_logger(v: dict) -> str:
    """Today's default: online with a key, else offline (``v`` holds ``WANDB_API_KEY`` while the variables parse)."""
    return "wandb" if v.get("WANDB_API_KEY") else "wandb-offline"


def wandb_mode(v: dict) -> str:
    """``WANDB_MODE`` for the chosen ``LOGGER``."""
    return WANDB_MODES[v["LOGGER"]]


def trainer_loggers(v: dict) -> list[str]:
    """``trainer.logger``: ``TRAINER_LOGGER``'s loggers with ``wandb`` and ``console`` as ``LOGGER`` says, ``file``
    always (the run's metrics log)."""
    chosen = [s.strip() for s in v["TRAINER_LOGGER"].split(",") if s.strip()]
    wandb, console = v["LOGGER"].startswith("wandb"), v["LOGGER"] == "console"
    dropped = ({"wandb"} if not wandb else set()) | ({"console"} if v["LOGGER"] == "off" else set())
    kept = [name for name in chosen if name not in dropped]
    required = ["file"] + ["wandb"] * wandb + ["console"] * console
    return kept + [name for name in required if name not in kept]


def has_wandb_key(env: Mapping[str, str]) -> bool:
    """A key wandb would find: ``WANDB_API_KEY``, or the ``~/.netrc`` entry ``wandb login`` writes."""
    if (env.get("WANDB_API_KEY") or "").strip():
        return True
    try:
        path = os.path.join(env.get("HOME") or os.path.expanduser("~"), ".netrc")
        return any("wandb" in host for host in netrc.netrc(path).hosts)
    except (OSError, netrc.NetrcParseError):
        return False


def logger_problems(env: Mapping[str, str], v: dict) -> list[str]:
    """The logger choices that cannot work, each named with its fix: online wandb without a key (wandb would fail
    inside the TaskRunner, after Ray and the workers started), or a ``WANDB_MODE`` that contradicts ``LOGGER``."""
    problems = []
    if v.get("LOGGER") == "wandb" and not has_wandb_key(env):
        problems.append("LOGGER=wandb logs to Weights & Biases online, but WANDB_API_KEY is not set (nor a `wandb "
                        "login` in ~/.netrc): export WANDB_API_KEY=<your key> (on a multi-node cluster on every node "
                        "before `ray start`), or LOGGER=wandb-offline (a run in the run directory, `wandb sync` "
                        "uploads it), LOGGER=console or LOGGER=off")
    mode = (env.get("WANDB_MODE") or "").strip()
    if mode and (env.get("LOGGER") or "").strip() and "LOGGER" in v and mode != WANDB_MODES[v["LOGGER"]]:
        problems.append(f"WANDB_MODE={mode} contradicts LOGGER={v['LOGGER']} (which means WANDB_MODE="
                        f"{WANDB_MODES[v['LOGGER']]}): unset WANDB_MODE; LOGGER alone chooses wandb online, offline "
                        "or none")
    return problems
