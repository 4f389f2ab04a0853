"""The SandboxFusion backend: the user's SandboxFusion server (``POST {url}/run_code``), in the request and answer
models of PyPI's ``sandbox-fusion`` client.

For machines where bwrap cannot create namespaces (inside docker). The server is the seed's:
``docker run -it -p 8080:8080 volcengine/sandbox-fusion:server-20250609`` (the training container then needs
``--network=host``, or the server's address in ``SANDBOX_FUSION_URL``).

The HTTP call is made here with aiohttp (the client's own dependency), not by the client's ``run_code_async``: that
one reads the whole answer before anything can bound it, and retries any failure, a read timeout or an HTTP 500
included, so a program the server already ran could run twice. Here:

- Limits: the request carries ``run_timeout`` (the server kills the program) and ``memory_limit_MB`` (servers from
  2025-06-17 on set it as RLIMIT_AS per process, only under their default ``isolation: none``; older ones, the
  ``server-20250609`` image included, ignore it). The API has no field for CPU time or cores, processes, file size,
  scratch space or open files, and no switch for the network: those are the server's own configuration.
- The answer is read in chunks, at most ``answer_budget(limits)`` bytes; past that the connection is closed and the
  result is ``output_limit``. Within it, stdout + stderr over ``max_output_bytes`` are cut (``output_limit`` too).
- A request is re-sent only when no connection was made (refused, DNS, connect timeout): the server never saw it.
  Anything later (a read timeout, an HTTP error, a dropped connection) is one ``timeout``/``sandbox_error`` result.
- Cancelling the awaiting task closes the connection, and that is all: the server runs the program on until it ends
  or reaches ``run_timeout``.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass, field

from recipe.tools.limits import MiB, SandboxLimits
from recipe.tools.result import ExecResult, Status, classify_exit, killed_detail

CLIENT_PIN = "sandbox-fusion==0.3.7"
SERVER_HINT = (
    "start its server (docker run -it -p 8080:8080 volcengine/sandbox-fusion:server-20250609) "
    "and set SANDBOX_FUSION_URL=http://HOST:8080"
)
JSON_ESCAPE_MAX = 6  # the longest JSON escape of one byte of text (\u00XX)
ANSWER_OVERHEAD = 64 * 1024  # the answer's other fields: statuses, times, the executor's name
ERROR_BODY_BYTES = 4096  # read of an HTTP error's body
CONNECT_TIMEOUT_S = 10.0
_CHUNK = 64 * 1024


def answer_budget(limits: SandboxLimits) -> int:
    """The most bytes of a ``run_code`` answer read: the whole output allowed and the program (the server's error
    message quotes it), each byte JSON-escaped at its longest, plus the other fields."""
    return JSON_ESCAPE_MAX * (limits.max_output_bytes + limits.max_code_bytes) + ANSWER_OVERHEAD


def _memory_mb(limits: SandboxLimits) -> int:
    return max(1, limits.memory_bytes // MiB)  # 0 or less means "no limit" to the server


def _client():
    try:
        import sandbox_fusion
    except ImportError:
        return None
    return sandbox_fusion


class _NeverSent(Exception):
    """No connection was made: the server never saw the request, so sending it again cannot run it twice."""


@dataclass
class SandboxFusionBackend:
    url: str = field(default_factory=lambda: os.environ.get("SANDBOX_FUSION_URL", ""))
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    max_attempts: int = 2  # connection attempts; only a request that never reached the server is sent again
    retry_backoff_s: float = 0.5  # doubled after each refused attempt
    # Added to the run timeout for the HTTP call itself (queueing and start-up on the server).
    http_margin_s: float = 30.0
    # Gaps of the server's isolation accepted by name (recipe/tools/fusion_probe.py: network, memory, processes).
    accept: frozenset = frozenset()
    name: str = "sandbox_fusion"
    probed: object = None  # the last fusion_probe.Probed, for describe_limits

    def describe_limits(self) -> str:
        """One line for the self-check: which limits the server is sent, which the client enforces, which neither,
        and what the startup probe found the server to hold."""
        lim = self.limits
        found = (f"; probed: {self.probed.describe()}" + (f"; accepted by name: {','.join(sorted(self.accept))}"
                                                          if self.accept else "")) if self.probed else ""
        return (f"sent to the server: run_timeout {lim.wall_timeout_s:g} s, memory_limit_MB "
                f"{_memory_mb(lim)} (RLIMIT_AS per process, on servers from 2025-06-17 on); read here: "
                f"at most {answer_budget(lim)} bytes of answer, output cut at {lim.max_output_bytes} bytes; CPU time, "
                f"processes, file sizes, scratch space and the network: the server's own configuration{found}")

    async def run(self, code: str, stdin: str | None = None) -> ExecResult:
        lim = self.limits
        t0 = time.monotonic()

        def fail(detail: str, status: Status = Status.SANDBOX_ERROR) -> ExecResult:
            return ExecResult(status, detail=detail, wall_s=time.monotonic() - t0, backend=self.name)

        if len(code.encode("utf-8", errors="replace")) > lim.max_code_bytes:
            return fail(killed_detail(Status.CODE_TOO_LONG, lim), Status.CODE_TOO_LONG)
        if not self.url:
            return fail(f"SANDBOX_FUSION_URL is not set: {SERVER_HINT}")
        sf = _client()
        if sf is None:
            return fail(f"the SandboxFusion client is not installed: pip install {CLIENT_PIN}")
        import aiohttp

        request = sf.RunCodeRequest(code=code, language="python", run_timeout=lim.wall_timeout_s,
                                    compile_timeout=lim.wall_timeout_s, stdin=stdin).dict()
        request["memory_limit_MB"] = _memory_mb(lim)
        payload = json.dumps(request).encode()
        budget = answer_budget(lim)
        total_s = lim.wall_timeout_s + self.http_margin_s
        for attempt in range(1, max(1, self.max_attempts) + 1):
            try:
                status, body, over = await self._post(payload, budget, total_s)
                break
            except _NeverSent as e:
                if attempt >= self.max_attempts:
                    cause = e.__cause__
                    return fail(f"cannot reach SandboxFusion at {self.url} after {attempt} attempt(s) "
                                f"({type(cause).__name__}: {str(cause)[:200]}): {SERVER_HINT}")
                await asyncio.sleep(self.retry_backoff_s * 2 ** (attempt - 1))
            except asyncio.TimeoutError:
                return fail(f"timeout: SandboxFusion at {self.url} did not answer within {total_s:g} s "
                            "(not sent again: the server may have run the program)", Status.TIMEOUT)
            except aiohttp.ClientError as e:
                return fail(f"SandboxFusion at {self.url} failed after the request was sent "
                            f"({type(e).__name__}: {str(e)[:200]}); not sent again: the server may have run it")
        wall = time.monotonic() - t0
        if status != 200:
            text = body.decode("utf-8", errors="replace").strip()[:300]
            return fail(f"SandboxFusion at {self.url} answered HTTP {status}: {text}")
        if over:
            return ExecResult(Status.OUTPUT_LIMIT, wall_s=wall, backend=self.name, extra={"answer_bytes": len(body)},
                              detail=f"output limit exceeded: the server's answer passed {budget} bytes (more than "
                                     f"{lim.max_output_bytes} bytes of output); reading stopped, the output is lost")
        try:
            resp = sf.RunCodeResponse(**json.loads(body))
        except Exception as e:  # noqa: BLE001 - not JSON, or not RunCodeResponse's shape: the server's fault
            return fail(f"SandboxFusion at {self.url} answered something that is not a run_code answer "
                        f"({type(e).__name__}: {str(e)[:200]})")
        return self._result(resp, wall, len(body))

    async def _post(self, payload: bytes, budget: int, total_s: float) -> tuple[int, bytes, bool]:
        """One POST: (HTTP status, the body up to the budget, whether the body went past it)."""
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=total_s, sock_connect=min(CONNECT_TIMEOUT_S, total_s))
        async with aiohttp.ClientSession(timeout=timeout) as session:
            try:
                resp = await session.post(f"{self.url.rstrip('/')}/run_code", data=payload,
                                          headers={"Content-Type": "application/json"})
            except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as e:
                raise _NeverSent() from e
            async with resp:
                limit = budget if resp.status == 200 else ERROR_BODY_BYTES
                body = bytearray()
                while len(body) <= limit:
                    chunk = await resp.content.read(min(_CHUNK, limit + 1 - len(body)))
                    if not chunk:
                        return resp.status, bytes(body), False
                    body += chunk
                resp.close()  # past the budget: drop the connection, never read the rest
                return resp.status, bytes(body[:limit]), resp.status == 200

    def _result(self, resp, wall: float, answer_bytes: int) -> ExecResult:
        lim = self.limits
        status = getattr(resp.status, "value", resp.status)
        run = resp.run_result or resp.compile_result
        if status == "SandboxError" or run is None:
            return ExecResult(Status.SANDBOX_ERROR, detail=f"SandboxFusion at {self.url}: {status}: "
                              f"{resp.message[:300]}", wall_s=wall, backend=self.name)
        stdout, stderr = run.stdout or "", run.stderr or ""
        out_b, err_b = stdout.encode("utf-8", errors="replace"), stderr.encode("utf-8", errors="replace")
        over = len(out_b) + len(err_b) > lim.max_output_bytes
        if over:
            out_b = out_b[: lim.max_output_bytes]
            err_b = err_b[: max(0, lim.max_output_bytes - len(out_b))]
            stdout = out_b.decode("utf-8", errors="replace")
            stderr = err_b.decode("utf-8", errors="replace")
        extra = {"server_execution_time": run.execution_time, "executor": resp.executor_pod_name,
                 "answer_bytes": answer_bytes}
        run_status = getattr(run.status, "value", run.status)
        if run_status == "TimeLimitExceeded":
            return ExecResult(Status.TIMEOUT, stdout, stderr, run.return_code, wall,
                              killed_detail(Status.TIMEOUT, lim), self.name, extra)
        if over:
            return ExecResult(Status.OUTPUT_LIMIT, stdout, stderr, run.return_code, wall,
                              f"output limit exceeded: more than {lim.max_output_bytes} bytes of output; cut",
                              self.name, extra)
        code = run.return_code
        if code is None and run_status == "Error":
            return ExecResult(Status.SANDBOX_ERROR, stdout, stderr, None, wall,
                              f"SandboxFusion could not run the program: {resp.message or run_status}", self.name,
                              extra)
        status, detail = classify_exit(code, stderr, lim)
        return ExecResult(status, stdout, stderr, code, wall, detail, self.name, extra)
