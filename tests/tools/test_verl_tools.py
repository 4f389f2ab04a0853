"""The verl 0.9.1 tool classes, loaded through verl's own tool registry from the shipped YAML, called as verl calls
them (create -> execute -> release per call); a hostile call yields an error reply and the next call works."""

import asyncio
import importlib.util
import os
import time
from pathlib import Path

import pytest
import yaml

from harness.proc_tree import named_below, stat
from harness.sandbox_check import require_sandbox

tool_registry = pytest.importorskip("verl.tools.tool_registry")
from verl.tools.base_tool import BaseTool  # noqa: E402
from verl.tools.schemas import ToolResponse  # noqa: E402

from recipe.tools.verl_tools import CalculatorTool, PythonTool, strip_code_fence  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[2] / "recipe" / "tools" / "configs"


def call(tool, args):
    """verl 0.9.1's sequence for a BaseTool (ToolAgentLoop._call_tool): create, execute, release."""

    async def go():
        instance_id, _ = await tool.create(create_kwargs={})
        try:
            return await tool.execute(instance_id, args, agent_data=None)
        finally:
            await tool.release(instance_id)

    return asyncio.run(go())


def test_verl_calls_tools_this_way():
    """Pin the contract above on verl's source (reading it, not importing the heavy agent loop)."""
    spec = importlib.util.find_spec("verl")
    src = (Path(spec.origin).parent / "experimental" / "agent_loop" / "tool_agent_loop.py").read_text()
    body = src[src.index("async def _call_tool(") :]
    body = body[: body.index("\n    async def ", 10) if "\n    async def " in body[10:] else len(body)]
    assert 'await tool.create(create_kwargs=kwargs.get("create_kwargs", {}))' in body
    assert "await tool.execute(\n                    instance_id, tool_args, agent_data=agent_data" in body
    assert "await tool.release(instance_id)" in body


@pytest.fixture(scope="module")
def calculator():
    (tool,) = tool_registry.initialize_tools_from_config(str(CONFIGS / "calculator.yaml"))
    return tool


def test_calculator_from_yaml(calculator):
    assert isinstance(calculator, CalculatorTool) and isinstance(calculator, BaseTool)
    assert calculator.name == "calculator"
    assert calculator.tool_schema.function.parameters.required == ["expression"]
    resp, reward, metrics = call(calculator, {"expression": "12 * (3 + 4) / 5"})
    assert isinstance(resp, ToolResponse) and resp.text == "16.8" and reward == 0.0
    assert metrics == {"calculator_error": 0}


def test_calculator_errors_are_replies(calculator):
    resp, _, metrics = call(calculator, {"expression": "2 / (1 - 1)"})
    assert resp.text == "Error: division by zero" and metrics["calculator_error"] == 1
    resp, _, _ = call(calculator, {"expr": "1"})
    assert resp.text.startswith("Error: the argument 'expression'")


def test_default_schema_without_yaml_schema():
    tool = CalculatorTool({"type": "native"}, None)
    assert tool.name == "calculator"
    assert PythonTool({"type": "native"}, None).name == "code_interpreter"


def _description(tool):
    """What verl puts in the prompt's tools list for this tool (ToolAgentLoop: tool_schema.model_dump(...))."""
    return tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True)["function"]["description"]


def test_description_follows_the_bubblewrap_backend(monkeypatch, tmp_path):
    limits = {"wall_timeout_s": 5, "cpu_time_s": 3, "memory_bytes": 268435456, "max_processes": 16,
              "max_output_bytes": 65536, "scratch_bytes": 33554432}
    for tool in (PythonTool({"type": "native", "backend": "bubblewrap", "limits": limits}, None),
                 _yaml_tool(monkeypatch, tmp_path, {"SANDBOX_BACKEND": "bubblewrap"}, limits)):
        text = _description(tool)
        assert "without network access" in text and "scratch directory is /tmp (32 MiB)" in text, text
        for claim in ("5 s", "3 s of CPU", "256 MiB of memory", "16 processes", "64 KiB of output"):
            assert claim in text, (claim, text)


def test_description_follows_the_landlock_backend(monkeypatch, tmp_path):
    """The landlock sandbox runs one process with one thread: the model is told, and promised no process count."""
    limits = {"wall_timeout_s": 5, "cpu_time_s": 3, "memory_bytes": 268435456, "max_output_bytes": 65536,
              "scratch_bytes": 33554432}
    for tool in (PythonTool({"type": "native", "backend": "landlock", "limits": limits}, None),
                 _yaml_tool(monkeypatch, tmp_path, {"SANDBOX_BACKEND": "landlock"}, limits)):
        text = _description(tool)
        assert "without network access" in text and "one process with one thread" in text, text
        assert "current directory (32 MiB)" in text and "/tmp" not in text and "16 processes" not in text, text
        for claim in ("5 s", "3 s of CPU", "256 MiB of memory", "64 KiB of output"):
            assert claim in text, (claim, text)


def test_description_follows_the_sandbox_fusion_backend(monkeypatch, tmp_path):
    """The server decides network, files, memory and processes: the model is promised only what the client
    enforces (the output cut) and the server is sent (the run timeout)."""
    limits = {"wall_timeout_s": 5, "max_output_bytes": 65536, "memory_bytes": 268435456}
    for tool in (PythonTool({"type": "native", "backend": "sandbox_fusion", "limits": limits}, None),
                 _yaml_tool(monkeypatch, tmp_path,
                            {"SANDBOX_BACKEND": "sandbox_fusion", "SANDBOX_FUSION_URL": "http://127.0.0.1:9"},
                            limits)):
        text = _description(tool)
        assert "SandboxFusion server" in text and "5 s" in text and "cut at 64 KiB" in text, text
        assert "as the server is set up" in text, text
        for promise in ("no network", "without network", "/tmp", "memory", "processes"):
            assert promise not in text.lower(), (promise, text)


def _yaml_tool(monkeypatch, tmp_path, env, limits):
    """The shipped python_tool.yaml through verl's registry, its ${oc.env:...} resolved from ``env``."""
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    cfg = yaml.safe_load((CONFIGS / "python_tool.yaml").read_text())
    cfg["tools"][0]["config"]["limits"].update(limits)
    path = tmp_path / "python_tool.yaml"
    path.write_text(yaml.safe_dump(cfg))
    (tool,) = tool_registry.initialize_tools_from_config(str(path))
    return tool


def test_strip_code_fence():
    assert strip_code_fence("```python\nprint(1)\n```") == "print(1)"
    assert strip_code_fence("```\nx=1\nprint(x)\n```\n") == "x=1\nprint(x)"
    assert strip_code_fence("print('```')") == "print('```')"


def _python_tool(tmp_path, **limits):
    cfg = yaml.safe_load((CONFIGS / "python_tool.yaml").read_text())
    cfg["tools"][0]["config"]["backend"] = "bubblewrap"
    cfg["tools"][0]["config"]["limits"].update(limits)
    path = tmp_path / "python_tool.yaml"
    path.write_text(yaml.safe_dump(cfg))
    (tool,) = tool_registry.initialize_tools_from_config(str(path))
    return tool


@pytest.fixture
def python_tool(tmp_path):
    # A generous wall clock: the CPU limit (1 s) must fire first even on a loaded machine (at 10 s a spin beside the
    # suite's vLLM engines once got less than 1 CPU-s before the wall clock ended it).
    tool = _python_tool(tmp_path, wall_timeout_s=30, cpu_time_s=1, memory_bytes=268435456, max_processes=16)
    require_sandbox(tool.backend)
    return tool


def test_python_tool_runs_code_and_goes_on_after_hostile_calls(python_tool, tmp_path):
    assert python_tool.name == "code_interpreter" and isinstance(python_tool, PythonTool)
    assert python_tool.backend.limits.wall_timeout_s == 30
    resp, reward, metrics = call(python_tool, {"code": "```python\nprint(sum(i*i for i in range(10)))\n```"})
    assert resp.text == "285\n" and reward == 0.0 and metrics["sandbox_status"] == "ok"
    short = _python_tool(tmp_path, wall_timeout_s=1.5)
    resp, _, metrics = call(short, {"code": "import time\ntime.sleep(30)"})
    assert resp.text.startswith("Error (timeout)") and metrics["sandbox_wall_s"] < 1.5 + 5, resp.text
    hostile = {
        "while True: pass": "Error (cpu_limit)",
        "x = bytearray(2**33)": "Error (memory_limit)",
        "import os\nwhile True: os.fork()": "Error (process_limit)",
        "while True: print('x' * 10000)": "Error (output_limit)",
        "import urllib.request\nurllib.request.urlopen('http://example.com', timeout=2)": "Error (no_network)",
        "open('/usr/x', 'w')": "Error (read_only_fs)",
        "1/0": "Error (error)",
    }
    for code, want in hostile.items():
        resp, _, metrics = call(python_tool, {"code": code})
        assert resp.text.startswith(want), (code, resp.text[:300])
        assert metrics["sandbox_status"] == want[len("Error (") : -1]
    resp, _, _ = call(python_tool, {"code": "print('still here')"})
    assert resp.text == "still here\n"


def test_python_tool_bad_arguments(python_tool):
    resp, _, metrics = call(python_tool, {"program": "print(1)"})
    assert resp.text.startswith("Error: the argument 'code'") and metrics["sandbox_status"] == "bad_arguments"


def test_python_tool_cancel_leaves_nothing(python_tool):
    """An aborted group cancels the task that awaits execute(): bwrap and everything in it are killed."""
    me = os.getpid()

    async def scenario():
        task = asyncio.create_task(python_tool.execute("id", {"code": "import time\ntime.sleep(60)"}))
        deadline = time.monotonic() + 10
        while not named_below(me, "bwrap"):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        pgid = stat(named_below(me, "bwrap")[0])["pgid"]  # the outer bwrap leads its own process group
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return pgid

    pgid = asyncio.run(scenario())
    deadline = time.monotonic() + 5
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, f"process group {pgid} still alive"
        time.sleep(0.05)


def test_python_tool_backend_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv("SANDBOX_BACKEND", "sandbox_fusion")
    monkeypatch.setenv("SANDBOX_FUSION_URL", "http://127.0.0.1:9")
    (tool,) = tool_registry.initialize_tools_from_config(str(CONFIGS / "python_tool.yaml"))
    assert tool.backend.name == "sandbox_fusion" and tool.backend.url == "http://127.0.0.1:9"
    if importlib.util.find_spec("sandbox_fusion") is not None:
        tool.backend.max_attempts = 1
        resp, _, metrics = call(tool, {"code": "print(1)"})
        assert resp.text.startswith("Error (sandbox_error): cannot reach SandboxFusion")
        assert metrics["backend"] == "sandbox_fusion"
