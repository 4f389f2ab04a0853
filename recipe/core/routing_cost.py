"""What MoE router replay (``ROUTER_REPLAY``) moves per step, as the rollout writes it and the trainer reads it, and
what vLLM holds for it (pure Python).

Router replay carries, for every token of a trajectory, the experts each MoE layer chose: ``layers x top_k`` small
integers. verl 0.9.1 carries them as int16 (``verl/experimental/agent_loop/agent_loop.py`` ``AgentLoopOutput.as_dict``
and ``_postprocess`` convert vLLM's array with ``dtype=torch.int16``; Megatron's own R2 record is viewed as int16 too,
``verl/utils/megatron/router_replay_utils.py``), over the whole sequence, prompt included (``as_dict`` aligns the
tensor to ``len(prompt) + len(response)`` rows). Qwen3-30B-A3B (48 layers, top-8): 768 bytes per token, 13.4 MB for a
response of 1024 + 16384 tokens.

Per step (R3): every launched response's routes go from the vLLM server to its agent-loop worker and into
TransferQueue (over-sampling launches ``ceil(B x (1 + ratio))`` prompts; the records an over-sample ``continue``
settle keeps for a resume have their routes emptied, ``recipe.adapter.oversample``, so none are held across steps).
The trainer then reads the trained batch's routes once per pass that reads the batch (verl's workers fetch every
field of the batch's records: ``KVBatchMeta.fields`` is None): the old log-probs (``compute_log_prob``, skipped in
bypass mode), the reference log-probs (a KL loss or KL reward; the reference does not replay them but fetches them),
and the update; and every rank of a data-parallel group fetches the group's shard, ``TP x PP x CP`` copies. R2
records the routes in Megatron's own log-prob pass and replays them in the update: the same tensor per trained
response, read once. Upper bounds: every response at its length limit.

vLLM keeps its own copy while it generates (vLLM 0.24, ``fused_moe/routed_experts_capturer.py``): a scheduler-side
buffer in each engine core's host memory with one row per KV-cache slot (``num_blocks x block_size``) of ``layers x
top_k`` ids, uint8 for up to 256 experts (uint16 above), allocated at start-up whatever the load; and per worker a
device buffer and a pinned copy of ``max_num_batched_tokens`` rows of int32.

``python -m recipe.core.routing_cost --layers 48 --top-k 8 ...`` prints the model for a configuration.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from .oversample import OverSampleController

ROUTE_DTYPE_BYTES = 2  # int16, as verl carries the routes (see above)
DEVICE_ROUTE_BYTES = 4  # int32: vLLM's per-worker capture buffer and its pinned copy
MODES = ("off", "R2", "R3")
# The preflight warns when one step's routes exceed this share of a node's memory: TransferQueue's storage units and
# the Ray object store live in host memory next to the workers' own.
WARN_SHARE_OF_NODE_MEMORY = 0.25


@dataclass(frozen=True)
class RoutingCost:
    """Bytes of routing data for one configuration (upper bounds: every response at its length limit)."""

    mode: str
    bytes_per_token: int
    per_response: int  # one trajectory: prompt + response tokens
    per_step: int  # written per step: into TransferQueue by the rollout (R3), by the log-prob pass (R2)
    launched_responses: int  # responses per step whose routes are recorded
    trained_responses: int  # responses per step the trainer reads
    reads: tuple[str, ...] = ()  # the trainer's passes that read the trained batch's routes
    model_parallel: int = 1  # ranks of a data-parallel group, each fetching the group's shard (TP x PP x CP)

    @property
    def trainer_reads(self) -> int:
        """Bytes the trainer's workers fetch from TransferQueue per step: each pass, each model-parallel rank."""
        return len(self.reads) * self.model_parallel * self.trained_responses * self.per_response


def bytes_per_token(layers: int, top_k: int) -> int:
    """Routing bytes of one token: one int16 expert index per MoE layer and routed expert."""
    if layers < 1 or top_k < 1:
        raise ValueError(f"router replay needs layers >= 1 and top_k >= 1, got layers={layers}, top_k={top_k}")
    return layers * top_k * ROUTE_DTYPE_BYTES


def launched_prompts(batch: int, over_sample_ratio: float) -> int:
    """Prompts launched per step: what the over-sample controller launches mid-epoch (``ratio`` 0: the batch)."""
    return OverSampleController(batch_size=batch, ratio=over_sample_ratio).launch_count(sys.maxsize)


def trainer_passes(mode: str, *, bypass_old_log_probs: bool = False, reference: bool = False) -> tuple[str, ...]:
    """The trainer's passes per step that fetch the trained batch's routes."""
    if mode == "R3":
        return (("old log-probs",) if not bypass_old_log_probs else ()) + (("ref",) if reference else ()) + ("update",)
    return ("update",) if mode == "R2" else ()


def routing_cost(mode: str, *, layers: int, top_k: int, batch: int, n: int, prompt_length: int,
                 response_length: int, over_sample_ratio: float = 0.0, bypass_old_log_probs: bool = False,
                 reference: bool = False, model_parallel: int = 1) -> RoutingCost:
    """The routing data of a configuration: ``mode`` off | R2 | R3; ``over_sample_ratio`` 0 when over-sampling is
    off; ``bypass_old_log_probs`` (``algorithm.rollout_correction.bypass_mode``), ``reference`` (a KL loss or KL
    reward) and ``model_parallel`` (the actor's TP x PP x CP): how the trainer reads them."""
    if mode not in MODES:
        raise ValueError(f"router replay mode must be one of {MODES}, got {mode!r}")
    if min(batch, n, prompt_length, response_length, model_parallel) < 1 or over_sample_ratio < 0:
        raise ValueError("batch, n, prompt_length, response_length and model_parallel must be >= 1 and the ratio >= 0")
    per_token = bytes_per_token(layers, top_k)
    per_response = (prompt_length + response_length) * per_token
    if mode == "off":
        return RoutingCost(mode, per_token, 0, 0, 0, 0)
    trained = batch * n
    launched = launched_prompts(batch, over_sample_ratio) * n if mode == "R3" else trained
    return RoutingCost(mode, per_token, per_response, launched * per_response, launched, trained,
                       trainer_passes(mode, bypass_old_log_probs=bypass_old_log_probs, reference=reference),
                       model_parallel)


def vllm_buffer_bytes_per_kv_token(layers: int, top_k: int, num_experts: int) -> int:
    """vLLM's scheduler-side routes buffer per KV-cache slot: ``layers x top_k`` ids, uint8 up to 256 experts."""
    return layers * top_k * (1 if num_experts <= 256 else 2)


def fmt_bytes(b: float) -> str:
    """Decimal units, as memory is usually quoted (12.6 MB, 103 GB)."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= scale:
            return f"{b / scale:.3g} {unit}"
    return f"{b:.0f} B"


def describe(cost: RoutingCost) -> str:
    """One line for the preflight's summary and docs/training.md."""
    if cost.mode == "off":
        return "off (no routes recorded)"
    where = "vLLM -> agent loops -> TransferQueue" if cost.mode == "R3" else "Megatron's log-prob pass -> TransferQueue"
    ranks = f" x {cost.model_parallel} model-parallel ranks" if cost.model_parallel > 1 else ""
    held = "; none held across steps" if cost.mode == "R3" else ""
    return (f"{cost.mode}: {cost.bytes_per_token} B/token (int16), up to {fmt_bytes(cost.per_response)} per response; "
            f"{fmt_bytes(cost.per_step)} written per step for {cost.launched_responses} responses ({where}); the "
            f"trainer reads {fmt_bytes(cost.trainer_reads)} per step ({cost.trained_responses} responses x "
            f"{len(cost.reads)} passes: {', '.join(cost.reads)}{ranks}){held}")


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
    ap.add_argument("--bypass", action="store_true", help="algorithm.rollout_correction.bypass_mode (no old log-probs)")
    ap.add_argument("--ref", action="store_true", help="a reference model (KL loss or KL reward)")
    ap.add_argument("--model-parallel", type=int, default=1, help="the actor's TP x PP x CP")
    a = ap.parse_args(argv)
    cost = routing_cost(a.mode, layers=a.layers, top_k=a.top_k, batch=a.batch, n=a.n, prompt_length=a.prompt_length,
                        response_length=a.response_length, over_sample_ratio=a.over_sample_ratio,
                        bypass_old_log_probs=a.bypass, reference=a.ref, model_parallel=a.model_parallel)
    print(describe(cost))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
