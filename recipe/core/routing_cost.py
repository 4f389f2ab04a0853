"""What MoE router replay (``ROUTER_REPLAY``) moves per step and holds across steps (pure Python).

Router replay carries, for every token of a trajectory, the experts each MoE layer chose: ``layers x top_k`` small
integers. verl 0.9.1 carries them as int16 (``verl/experimental/agent_loop/agent_loop.py`` ``AgentLoopOutput.as_dict``
and ``_postprocess`` convert vLLM's array with ``dtype=torch.int16``; Megatron's own R2 record is viewed as int16 too,
``verl/utils/megatron/router_replay_utils.py``), over the whole sequence, prompt included (``as_dict`` aligns the
tensor to ``len(prompt) + len(response)`` rows). vLLM keeps them narrower on its side (uint8 for up to 256 experts,
``RoutedExpertsManager`` in ``vllm/model_executor/layers/fused_moe/routed_experts_capturer.py``), but what crosses Ray
and TransferQueue is verl's int16 tensor. Qwen3-30B-A3B (48 layers, top-8): 768 bytes per token, 12.6 MB for a
16k-token response, ~100 GB for a step of 512 prompts x 16.

Per step (R3): every launched response's routes go from the vLLM server to its agent-loop worker, into TransferQueue,
and out to the trainer workers; over-sampling launches ``ceil(B x (1 + ratio))`` prompts, and in ``continue`` mode
the aborted groups' records stay in TransferQueue until they are resumed in the next step (held across steps). R2
records the routes in Megatron's own log-prob pass and replays them in the update: the same tensor per trained
response, never across steps. Upper bounds: every response at its length limit.

``python -m recipe.core.routing_cost --layers 48 --top-k 8 ...`` prints the model for a configuration.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from .oversample import OverSampleController

ROUTE_DTYPE_BYTES = 2  # int16, as verl carries the routes (see above)
MODES = ("off", "R2", "R3")
# The preflight warns when one step's routes plus what is held across steps exceed this share of a node's memory:
# TransferQueue's storage units and the Ray object store live in host memory next to the workers' own.
WARN_SHARE_OF_NODE_MEMORY = 0.25


@dataclass(frozen=True)
class RoutingCost:
    """Bytes of routing data for one configuration (upper bounds: every response at its length limit)."""

    mode: str
    bytes_per_token: int
    per_response: int  # one trajectory: prompt + response tokens
    per_step: int  # through Ray and TransferQueue in one step (R3), or between log-prob pass and update (R2)
    held_across_steps: int  # over-sample continue: the aborted groups' records kept for the next step
    launched_responses: int  # responses per step whose routes are recorded

    @property
    def total(self) -> int:
        """What one step can have in flight at once: its own routes plus those kept from the step before."""
        return self.per_step + self.held_across_steps


def bytes_per_token(layers: int, top_k: int) -> int:
    """Routing bytes of one token: one int16 expert index per MoE layer and routed expert."""
    if layers < 1 or top_k < 1:
        raise ValueError(f"router replay needs layers >= 1 and top_k >= 1, got layers={layers}, top_k={top_k}")
    return layers * top_k * ROUTE_DTYPE_BYTES


def launched_prompts(batch: int, over_sample_ratio: float) -> int:
    """Prompts launched per step: what the over-sample controller launches mid-epoch (``ratio`` 0: the batch)."""
    return OverSampleController(batch_size=batch, ratio=over_sample_ratio).launch_count(sys.maxsize)


def routing_cost(mode: str, *, layers: int, top_k: int, batch: int, n: int, prompt_length: int,
                 response_length: int, over_sample_ratio: float = 0.0, continue_partial: bool = False
                 ) -> RoutingCost:
    """The routing data of a configuration: ``mode`` off | R2 | R3; ``over_sample_ratio`` 0 when over-sampling is
    off; ``continue_partial`` for ``OVER_SAMPLE_REQUEUE=continue``."""
    if mode not in MODES:
        raise ValueError(f"router replay mode must be one of {MODES}, got {mode!r}")
    if min(batch, n, prompt_length, response_length) < 1 or over_sample_ratio < 0:
        raise ValueError("batch, n, prompt_length and response_length must be >= 1 and the ratio >= 0")
    per_token = bytes_per_token(layers, top_k)
    per_response = (prompt_length + response_length) * per_token
    if mode == "off":
        return RoutingCost(mode, per_token, 0, 0, 0, 0)
    if mode == "R2":  # the trainer records and replays its own routes: trained responses only, nothing kept
        return RoutingCost(mode, per_token, per_response, batch * n * per_response, 0, batch * n)
    launched = launched_prompts(batch, over_sample_ratio) * n
    held = (launched - batch * n) * per_response if continue_partial else 0
    return RoutingCost(mode, per_token, per_response, launched * per_response, held, launched)


def fmt_bytes(b: float) -> str:
    """Decimal units, as memory is usually quoted (12.6 MB, 103 GB)."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= scale:
            return f"{b / scale:.3g} {unit}"
    return f"{b:.0f} B"


def describe(cost: RoutingCost) -> str:
    """One line for the preflight's summary and docs/results.md."""
    if cost.mode == "off":
        return "off (no routes recorded)"
    where = ("vLLM -> agent loops -> TransferQueue -> Megatron" if cost.mode == "R3"
             else "Megatron's log-prob pass -> its update")
    held = f"; held across steps (over-sample continue): {fmt_bytes(cost.held_across_steps)}" \
        if cost.held_across_steps else ""
    return (f"{cost.mode}: {cost.bytes_per_token} B/token (int16), up to {fmt_bytes(cost.per_response)} per response, "
            f"{fmt_bytes(cost.per_step)} per step for {cost.launched_responses} responses ({where}){held}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m recipe.core.routing_cost", description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=MODES, default="R3")
    ap.add_argument("--layers", type=int, default=48, help="MoE layers (Qwen3-30B-A3B: 48)")
    ap.add_argument("--top-k", type=int, default=8, help="experts per token (Qwen3-30B-A3B: 8)")
    ap.add_argument("--batch", type=int, default=512, help="prompts per step (TRAIN_BATCH_SIZE)")
    ap.add_argument("--n", type=int, default=16, help="responses per prompt (ROLLOUT_N)")
    ap.add_argument("--prompt-length", type=int, default=1024, help="MAX_PROMPT_LENGTH")
    ap.add_argument("--response-length", type=int, default=16384, help="MAX_RESPONSE_LENGTH")
    ap.add_argument("--over-sample-ratio", type=float, default=0.0, help="OVER_SAMPLE_RATIO (0: off)")
    ap.add_argument("--continue-partial", action="store_true", help="OVER_SAMPLE_REQUEUE=continue")
    a = ap.parse_args(argv)
    cost = routing_cost(a.mode, layers=a.layers, top_k=a.top_k, batch=a.batch, n=a.n, prompt_length=a.prompt_length,
                        response_length=a.response_length, over_sample_ratio=a.over_sample_ratio,
                        continue_partial=a.continue_partial)
    print(describe(cost))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
