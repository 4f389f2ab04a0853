"""The SandboxFusion backend: the user's SandboxFusion server, through PyPI's ``sandbox-fusion`` client.

For machines where bwrap cannot create namespaces (inside docker). The server is the seed's:
``docker run -it -p 8080:8080 volcengine/sandbox-fusion:server-20250609`` (the training container then needs
``--network=host``, or the server's address in ``SANDBOX_FUSION_URL``).

The call goes through the client's ``run_code_async`` (``POST {url}/run_code`` with a ``RunCodeRequest``; aiohttp,
so cancelling the awaiting task closes the connection). The client retries failures ``max_attempts`` times with
exponential back-off and raises a bare ``Exception`` for HTTP errors and for the server's ``SandboxError``; those
become ``sandbox_error`` results here, never exceptions, so a rollout goes on.

Limits: the request carries ``run_timeout`` (the wall-clock limit); the output is cut at ``max_output_bytes``
(``output_limit``; the server has buffered it whole already). Memory, CPU and process limits are the server's own
configuration: the run_code API has no fields for them.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from dataclasses import dataclass, field

from recipe.tools.limits import SandboxLimits
from recipe.tools.result import ExecResult, Status, classify_exit, killed_detail

CLIENT_PIN = "sandbox-fusion==0.3.7"
SERVER_HINT = (
    "start its server (docker run -it -p 8080:8080 volcengine/sandbox-fusion:server-20250609) "
    "and set SANDBOX_FUSION_URL=http://HOST:8080"
)


def _client():
    try:
        import sandbox_fusion
    except ImportError:
        return None
    return sandbox_fusion


@dataclass
class SandboxFusionBackend:
    url: str = field(default_factory=lambda: os.environ.get("SANDBOX_FUSION_URL", ""))
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    max_attempts: int = 2  # the client's own retries (exponential back-off, ~1-3 s between attempts)
    # Added to the run timeout for the HTTP call itself (queueing and start-up on the server).
    http_margin_s: float = 30.0
    name: str = "sandbox_fusion"

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
        request = sf.RunCodeRequest(
            code=code,
            language="python",
            run_timeout=lim.wall_timeout_s,
            compile_timeout=lim.wall_timeout_s,
            stdin=stdin,
        )
        try:
            resp = await sf.run_code_async(
                request,
                endpoint=self.url,
                max_attempts=self.max_attempts,
                client_timeout=lim.wall_timeout_s + self.http_margin_s,
            )
        except asyncio.TimeoutError:
            return fail(
                f"timeout: SandboxFusion at {self.url} did not answer within "
                f"{lim.wall_timeout_s + self.http_margin_s:g} s",
                Status.TIMEOUT,
            )
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the client raises bare Exceptions (see the module docstring)
            return fail(_describe(e, self.url))
        return self._result(resp, t0)

    def _result(self, resp, t0: float) -> ExecResult:
        lim = self.limits
        run = resp.run_result or resp.compile_result
        wall = time.monotonic() - t0
        if run is None:
            status = getattr(resp.status, "value", resp.status)
            return ExecResult(Status.SANDBOX_ERROR, detail=f"SandboxFusion: {status}: {resp.message}", wall_s=wall,
                              backend=self.name)
        stdout, stderr = run.stdout or "", run.stderr or ""
        out_b, err_b = stdout.encode("utf-8", errors="replace"), stderr.encode("utf-8", errors="replace")
        over = len(out_b) + len(err_b) > lim.max_output_bytes
        if over:
            out_b = out_b[: lim.max_output_bytes]
            err_b = err_b[: max(0, lim.max_output_bytes - len(out_b))]
            stdout = out_b.decode("utf-8", errors="replace")
            stderr = err_b.decode("utf-8", errors="replace")
        extra = {"server_execution_time": run.execution_time, "executor": resp.executor_pod_name}
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


def _describe(e: Exception, url: str) -> str:
    text = str(e) or type(e).__name__
    m = re.match(r"Faas api responded with code (\d+): (.*)", text, re.S)
    if m:
        return f"SandboxFusion at {url} answered HTTP {m.group(1)}: {m.group(2).strip()[:300]}"
    if text.startswith("Sandbox responded with error"):
        return f"SandboxFusion at {url}: {text[:300]}"
    name = type(e).__name__
    if "Connect" in name or isinstance(e, (ConnectionError, OSError)):
        return f"cannot reach SandboxFusion at {url} ({name}: {text[:200]}): {SERVER_HINT}"
    return f"SandboxFusion at {url} failed: {name}: {text[:300]}"
