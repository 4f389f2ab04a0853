"""verl 0.9.1 tool classes (``BaseTool`` subclasses): the only module of ``recipe.tools`` that imports verl.

verl's ``ToolAgentLoop`` calls ``create`` -> ``execute`` -> ``release`` once per tool call
(``experimental/agent_loop/tool_agent_loop.py`` ~:476-496) and turns an exception into an error reply; these tools
never raise for bad input or a hostile program: the reply is the error text (``Error (<status>): ...``), the reward
0.0, and ``tool_metrics`` say what happened. Registered through verl's tool config YAML
(``actor_rollout_ref.rollout.multi_turn.tool_config_path``): ``recipe/tools/configs/*.yaml``.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any, Optional
from uuid import uuid4

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from verl.utils.rollout_trace import rollout_trace_op

from recipe.tools.calculator import CALCULATOR_SCHEMA, calculate
from recipe.tools.fusion import SandboxFusionBackend
from recipe.tools.landlock_sandbox import LandlockBackend
from recipe.tools.limits import MiB
from recipe.tools.result import format_for_model
from recipe.tools.sandbox import make_backend


def _size(n: int) -> str:
    return f"{n // MiB} MiB" if n % MiB == 0 else f"{n // 1024} KiB" if n % 1024 == 0 else f"{n} bytes"


def describe_sandbox(backend) -> str:
    """The Python tool's description for the model: only what ``backend`` enforces, with its configured limits.

    A SandboxFusion server decides the network, files, memory and processes by its own configuration
    (``recipe.tools.fusion``), so that description promises only the run timeout and the output cut.
    """
    lim = backend.limits
    if isinstance(backend, SandboxFusionBackend):
        return (
            f"Run a Python 3 program on a SandboxFusion server and return what it prints. The program is stopped "
            f"after {lim.wall_timeout_s:g} s and its output is cut at {_size(lim.max_output_bytes)}; network, files "
            "and other limits are as the server is set up. Print the values you need."
        )
    if isinstance(backend, LandlockBackend):
        return (
            "Run a Python 3 program in a sandbox without network access and return what it prints. It runs as one "
            "process with one thread (no threads, subprocesses or multiprocessing); its scratch directory is the "
            f"current directory ({_size(lim.scratch_bytes)}); it gets at most {lim.wall_timeout_s:g} s "
            f"({lim.cpu_time_s} s of CPU), {_size(lim.memory_bytes)} of memory and {_size(lim.max_output_bytes)} of "
            "output. Print the values you need."
        )
    return (
        "Run a Python 3 program in a sandbox without network access and return what it prints. Its scratch "
        f"directory is /tmp ({_size(lim.scratch_bytes)}); the program gets at most {lim.wall_timeout_s:g} s "
        f"({lim.cpu_time_s} s of CPU), {_size(lim.memory_bytes)} of memory, {lim.max_processes} processes or "
        f"threads and {_size(lim.max_output_bytes)} of output. Print the values you need."
    )


def _python_schema(description: str) -> dict:
    return {
        "type": "function",
        "function": {
            "name": "code_interpreter",
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string", "description": "the Python program to run"}},
                "required": ["code"],
            },
        },
    }


_FENCE = re.compile(r"^\s*```[a-zA-Z0-9_+-]*\s*\n(.*?)\n?```\s*$", re.S)


def strip_code_fence(code: str) -> str:
    """Models often wrap the argument in a markdown fence: run what is inside."""
    m = _FENCE.match(code)
    return m.group(1) if m else code


class CalculatorTool(BaseTool):
    """Exact arithmetic (``recipe.tools.calculator``), for GSM8K-style data. Config: none besides ``type``."""

    def __init__(self, config: dict, tool_schema: Optional[OpenAIFunctionToolSchema] = None):
        self._default_schema = OpenAIFunctionToolSchema.model_validate(CALCULATOR_SCHEMA)
        super().__init__(config or {}, tool_schema)

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        return self._default_schema

    async def create(self, instance_id: Optional[str] = None, **kwargs) -> tuple[str, ToolResponse]:
        return instance_id or str(uuid4()), ToolResponse()

    @rollout_trace_op
    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        expression = parameters.get("expression")
        if not isinstance(expression, str):
            return ToolResponse(text="Error: the argument 'expression' (a string) is missing"), 0.0, {
                "calculator_error": 1
            }
        text = calculate(expression)
        return ToolResponse(text=text), 0.0, {"calculator_error": int(text.startswith("Error"))}

    async def release(self, instance_id: str, **kwargs) -> None:
        return None


class PythonTool(BaseTool):
    """Python execution in a sandbox, for DAPO/ReTool-style data.

    Config keys (all optional): ``backend`` (``bubblewrap`` | ``landlock`` | ``sandbox_fusion``; env
    ``SANDBOX_BACKEND``),
    ``sandbox_fusion_url`` (env ``SANDBOX_FUSION_URL``), ``python`` (the interpreter inside bwrap; env
    ``SANDBOX_PYTHON``), ``limits`` (``recipe.tools.limits.SandboxLimits`` fields; env ``SANDBOX_<FIELD>``),
    ``max_concurrency`` (sandboxes at once in this process, default 8), ``max_reply_chars`` (default 4000).
    Its description is ``describe_sandbox(backend)``, whatever a YAML ``tool_schema`` says.
    """

    def __init__(self, config: dict, tool_schema: Optional[OpenAIFunctionToolSchema] = None):
        cfg = {k: v for k, v in (config or {}).items() if k != "type"}
        self.backend = make_backend(config=cfg)
        # The description is always the backend's (a YAML tool_schema sets the name and parameters): the model is
        # told only what this sandbox enforces.
        description = describe_sandbox(self.backend)
        if tool_schema is None:
            tool_schema = OpenAIFunctionToolSchema.model_validate(_python_schema(description))
        else:
            tool_schema = tool_schema.model_copy(deep=True)
            tool_schema.function.description = description
        self._default_schema = tool_schema
        super().__init__(config or {}, tool_schema)
        self.max_concurrency = int(cfg.get("max_concurrency", 8))
        self.max_reply_chars = int(cfg.get("max_reply_chars", 4000))
        self._semaphores: dict[int, asyncio.Semaphore] = {}

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        return self._default_schema

    def _semaphore(self) -> asyncio.Semaphore:
        # One per event loop: verl may run agent loops on more than one loop in a process.
        loop = asyncio.get_running_loop()
        sem = self._semaphores.get(id(loop))
        if sem is None:
            sem = self._semaphores[id(loop)] = asyncio.Semaphore(self.max_concurrency)
        return sem

    async def create(self, instance_id: Optional[str] = None, **kwargs) -> tuple[str, ToolResponse]:
        return instance_id or str(uuid4()), ToolResponse()

    @rollout_trace_op
    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        code = parameters.get("code")
        if not isinstance(code, str) or not code.strip():
            return ToolResponse(text="Error: the argument 'code' (a non-empty string) is missing"), 0.0, {
                "sandbox_status": "bad_arguments"
            }
        async with self._semaphore():
            result = await self.backend.run(strip_code_fence(code))
        return ToolResponse(text=format_for_model(result, self.max_reply_chars)), 0.0, result.metrics()

    async def release(self, instance_id: str, **kwargs) -> None:
        return None
