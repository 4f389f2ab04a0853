"""A calculator with real tool latency: each call first runs a sandboxed process that sleeps, then answers.

For tests and CPU runs that must show what a slow tool does to a rollout (aborts mid-tool, settles that do not wait
for the tool, no process left behind): the latency is a real ``bubblewrap`` process, so a cancelled call has a
process to kill. Each call appends ``start`` (with its latency) and then ``done`` or ``cancelled`` (worker pid, wall
time) as JSON lines to ``events_path`` when set. Config (verl tool YAML ``config``): ``latency_s`` (default 1.0),
``slow_share`` of the calls (drawn per call, default 0) that take ``slow_latency_s`` instead, ``events_path``, and
the sandbox keys of ``recipe.tools.sandbox.make_backend``.

Why a slow share: with one fixed latency, a step's calls start together (the first turns are all about as long) and
so end together, before the step's last answers; an abort at the end of the step then never finds a call in flight.
A few calls far slower than the rest, as real tools have, are what the slowest groups are waiting for.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import time
from pathlib import Path
from typing import Any, Optional
from uuid import uuid4

from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from recipe.tools.result import format_for_model
from recipe.tools.sandbox import make_backend
from recipe.tools.verl_tools import CalculatorTool


class SlowCalculatorTool(CalculatorTool):
    def __init__(self, config: dict, tool_schema: Optional[OpenAIFunctionToolSchema] = None):
        super().__init__(config, tool_schema)
        own = ("type", "latency_s", "slow_share", "slow_latency_s", "events_path")
        cfg = {k: v for k, v in (config or {}).items() if k not in own}
        self.latency_s = float((config or {}).get("latency_s", 1.0))
        self.slow_share = float((config or {}).get("slow_share", 0.0))
        self.slow_latency_s = float((config or {}).get("slow_latency_s", self.latency_s))
        self.rng = random.Random()
        self.events_path = (config or {}).get("events_path") or None
        self.backend = make_backend(config=cfg)

    def _event(self, call: str, event: str, **extra) -> None:
        if self.events_path:
            with open(self.events_path, "a") as f:
                f.write(json.dumps({"call": call, "event": event, "pid": os.getpid(), "t": time.time(), **extra})
                        + "\n")

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        call = uuid4().hex
        latency_s = self.slow_latency_s if self.rng.random() < self.slow_share else self.latency_s
        self._event(call, "start", latency_s=latency_s)
        try:
            result = await self.backend.run(f"import time\ntime.sleep({latency_s!r})\n")
        except asyncio.CancelledError:
            self._event(call, "cancelled")
            raise
        self._event(call, "done", status=result.status.value)
        if not result.ok:
            return ToolResponse(text=format_for_model(result)), 0.0, result.metrics()
        return await super().execute(instance_id, parameters, **kwargs)


def slow_tool_config(root: Path, latency_s: float, slow_share: float = 0.0, slow_latency_s: float = 0.0) -> Path:
    """``root/slow_calculator.yaml``: the recipe's calculator tool config with this tool, ``latency_s`` per call
    (``slow_latency_s`` for a ``slow_share`` of them), its events in ``root/tool_events.jsonl``."""
    from omegaconf import OmegaConf

    from recipe.preflight.knobs import TOOL_CONFIGS

    cfg = OmegaConf.load(TOOL_CONFIGS / "calculator.yaml")
    cfg.tools[0].class_name = f"{__name__}.SlowCalculatorTool"
    cfg.tools[0].config.latency_s = float(latency_s)
    cfg.tools[0].config.slow_share = float(slow_share)
    cfg.tools[0].config.slow_latency_s = float(slow_latency_s or latency_s)
    cfg.tools[0].config.events_path = str(Path(root) / "tool_events.jsonl")
    Path(root).mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, Path(root) / "slow_calculator.yaml")
    return Path(root) / "slow_calculator.yaml"
