"""The config each run was launched with, and which keys differ between two runs beyond the arms' own switches.

``scripts/train_grpo.sh`` passes ``hydra.run.dir=<run dir>/hydra/<launch stamp>``; Hydra 1.3 writes the composed
job config there as ``.hydra/config.yaml`` (``OmegaConf.to_yaml`` before the job runs, so a launch that crashed has
one too). It is the config *before resolution*: interpolations are recorded as written. An interpolation of another
key is the same text in both runs and its source key is compared; an ``${oc.env:...}`` read of the launch
environment is not recorded at all, so such keys are reported as unknown rather than as equal.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

# What a comparison's arms are expected to set differently (the recipe's switches, verl's data order, run naming).
ARM_PREFIXES = ("data.sampler.", "recipe.cap.", "recipe.over_sample.")
ARM_KEYS = frozenset(
    {
        "actor_rollout_ref.rollout.enforce_eager",
        # ROUTER_REPLAY: an A/B of router replay (R3 on against off) differs in exactly these
        "actor_rollout_ref.rollout.enable_rollout_routing_replay",
        "actor_rollout_ref.actor.megatron.router_replay.mode",
        "data.shuffle",
        "data.seed",
        "trainer.experiment_name",
        "trainer.default_local_dir",
    }
)
RUN_DIR_KEY = "trainer.default_local_dir"
ENV_READ = "${oc.env:"
ABSENT = object()
_STAMP = re.compile(r"^(?P<base>.*?)(?:-(?P<n>\d+))?$")


@dataclass
class RunConfig:
    """The last launch's config of a run, flattened to dotted keys (lists are single values)."""

    file: Path
    values: dict[str, object]
    launches: int

    @property
    def run_dir(self) -> str | None:
        """The run directory the config names (``trainer.default_local_dir``), when it is a literal path."""
        d = self.values.get(RUN_DIR_KEY)
        return d.rstrip("/") if isinstance(d, str) and "${" not in d else None


def flatten(node, prefix: str = "") -> dict[str, object]:
    if isinstance(node, dict) and node:
        out = {}
        for k, v in node.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: node}


def load_config(file: Path) -> dict[str, object]:
    """A Hydra ``config.yaml`` as dotted key -> value, unresolved (OmegaConf's loader, as Hydra wrote it)."""
    return flatten(OmegaConf.to_container(OmegaConf.load(file), resolve=False))


def _launch_order(file: Path):
    """Launch stamps (``20250101T000000Z``, then ``...Z-2`` for a second launch in the same second) sort by content,
    which survives copying the run, unlike mtimes."""
    m = _STAMP.match(file.parent.parent.name)
    return m["base"], int(m["n"] or 1), str(file)


def find_config(path: str | os.PathLike) -> tuple[RunConfig | None, list[str]]:
    """The run's last launch config under ``path`` (None if there is none) and notes on launches that differ."""
    path = Path(path)
    if not path.is_dir():
        return None, []
    files = sorted((f for f in path.rglob("config.yaml") if f.parent.name == ".hydra"), key=_launch_order)
    if not files:
        return None, []
    last = RunConfig(files[-1], load_config(files[-1]), len(files))
    notes = []
    for f in files[:-1]:
        earlier = RunConfig(f, load_config(f), 1)
        changed = [k for k, *_ in diff(earlier, last) if not _run_path(k, earlier, last)]
        if changed:
            notes.append(f"launch config {f} differs from the last launch's in: {', '.join(changed)}")
    return last, notes


def show(value) -> str:
    return "<absent>" if value is ABSENT else json.dumps(value, default=str)


def diff(a: RunConfig, b: RunConfig) -> list[tuple[str, object, object]]:
    """(key, A value, B value) for every key whose recorded value differs (``ABSENT`` where a run lacks it).
    Values compare as recorded (JSON form), so ``1`` vs ``1.0`` and ``true`` vs ``1`` count as different."""
    out = []
    for key in sorted(a.values.keys() | b.values.keys()):
        va, vb = a.values.get(key, ABSENT), b.values.get(key, ABSENT)
        if show(va) != show(vb):
            out.append((key, va, vb))
    return out


def _under(value, run_dir: str | None) -> bool:
    return isinstance(value, str) and run_dir is not None and (value == run_dir or value.startswith(run_dir + "/"))


def _run_path(key: str, a: RunConfig, b: RunConfig) -> bool:
    """A path inside each run's own directory (logger files, wandb dir): expected to differ."""
    return _under(a.values.get(key), a.run_dir) and _under(b.values.get(key), b.run_dir)


def is_arm_switch(key: str, a: RunConfig, b: RunConfig) -> bool:
    return key in ARM_KEYS or key.startswith(ARM_PREFIXES) or _run_path(key, a, b)


def env_reads(cfg: RunConfig) -> list[str]:
    return [k for k, v in cfg.values.items() if isinstance(v, str) and ENV_READ in v]


def render_config_diff(a: RunConfig | None, b: RunConfig | None, names: tuple[str, str]) -> str:
    """Markdown: the differing keys (``key: A -> B``) first, then a WARNING line per key outside the arms' switches
    and one for keys whose values the launch environment decided."""
    lines = [f"## Config: {names[1]} vs {names[0]}", ""]
    missing = [n for n, c in zip(names, (a, b)) if c is None]
    if missing:
        lines.append(
            f"Not compared: no Hydra config (hydra/<stamp>/.hydra/config.yaml, written by scripts/train_grpo.sh) "
            f"under {' and '.join(missing)}; pass the run directory itself (checkpoints/<experiment>/), not its logs/"
        )
        return "\n".join(lines) + "\n"
    for n, c in zip(names, (a, b)):
        lines.append(f"- {n}: `{c.file}` (last of {c.launches} launch(es))")
    lines.append("")
    changes = diff(a, b)
    lines += [f"- {k}: {show(va)} -> {show(vb)}" for k, va, vb in changes] or ["- no differences"]
    others = [(k, va, vb) for k, va, vb in changes if not is_arm_switch(k, a, b)]
    lines += [""] if others else []
    lines += [
        f"WARNING: {k} differs beyond the arms' own switches: {names[0]} {show(va)} -> {names[1]} {show(vb)}"
        for k, va, vb in others
    ]
    unknown = sorted(set(env_reads(a)) | set(env_reads(b)))
    if unknown:
        lines += [
            "",
            f"WARNING: {', '.join(unknown)}: recorded as {ENV_READ}...}} reads of the launch environment, whose values "
            "Hydra does not record: whether they differ is unknown (launch through scripts/train_grpo.sh, which sets "
            "them explicitly)",
        ]
    return "\n".join(lines) + "\n"
