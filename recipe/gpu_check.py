"""``python -m recipe.gpu_check``: the checks of ``scripts/gpu_check.sh`` that the CPU tests cannot run.

``scripts/gpu_check.sh`` converts the smoke preset's tiny Qwen3-MoE into a dist checkpoint with
``scripts/convert_hf_to_distcp.sh`` and then runs ``logits`` here: verl 0.9.1's Megatron engine
(``EngineRegistry.new("language_model", "megatron")``: Megatron-Bridge model, TP = PP = EP = 1, forward only, bf16)
loads that checkpoint exactly as the actor and the ref do (``use_dist_checkpointing=True``), and two checks compare
it with the Hugging Face checkpoint:

- weights: every tensor the engine exports for vLLM (``get_per_tensor_param``, Megatron-Bridge's HF export: what
  verl pushes into vLLM at every weight sync) has the name and shape of a tensor in MODEL_PATH's safetensors and
  equals it rounded to bf16, and every safetensors tensor is exported;
- logits: the engine's GPTModel and the HF model (fp32) on fixed random tokens: mean KL(HF || engine) per position
  at most :data:`KL_MEAN_MAX` and top-1 agreement at least :data:`TOP1_MIN`.

Why both: the tiny random model's logits barely depend on its experts (init std 0.02). Measured on the CPU with HF
alone (fp32 reference, 4 x 64 random tokens): bf16 rounding gives a mean KL of 2.1e-6 and top-1 agreement 0.98;
two experts of a layer swapped 4.8e-6 (indistinguishable), router rows permuted 1.3e-5; k and v projections
swapped in one layer 1.8e-2 (top-1 0.03), a q_norm halved 9.0e-5 (top-1 0.90). So the logits catch attention,
norm, embedding and layer-order errors; the exact weight comparison catches expert, gate/up and router mix-ups.
Not checked here: TP/PP/EP > 1 (one GPU), training steps (the smoke step of the script does those).

``table`` prints the script's pass/fail table; ``smoke-result`` checks the smoke run's logs. Both are pure and
tested on the CPU (tests/scripts/test_gpu_check.py); verl's Megatron pieces are imported only by ``logits``.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

# 10x the bf16 rounding noise measured above (2.1e-6); a q_norm halved in one layer gives 9.0e-5.
KL_MEAN_MAX = 2e-5
TOP1_MIN = 0.9
TOKENS_SHAPE = (4, 64)  # batch x sequence of random token ids, seed 0


def logit_metrics(reference, test) -> dict[str, float]:
    """Agreement of two ``[batch, seq, vocab]`` logit tensors (torch), ``reference`` taken as the truth."""
    ref, out = reference.float().log_softmax(-1), test.float().log_softmax(-1)
    kl = (ref.exp() * (ref - out)).sum(-1)
    return {"kl_mean": kl.mean().item(), "kl_max": kl.max().item(),
            "max_abs_logit_diff": (test.float() - reference.float()).abs().max().item(),
            "top1_agreement": (test.argmax(-1) == reference.argmax(-1)).float().mean().item()}


def logits_verdict(m: Mapping[str, float]) -> tuple[bool, str]:
    ok = m["kl_mean"] <= KL_MEAN_MAX and m["top1_agreement"] >= TOP1_MIN  # NaN fails both
    return ok, (f"mean KL {m['kl_mean']:.2e} (max {KL_MEAN_MAX:.0e}), top-1 {m['top1_agreement']:.3f} "
                f"(min {TOP1_MIN}), max KL {m['kl_max']:.2e}, max |dlogit| {m['max_abs_logit_diff']:.3g}")


def weight_problems(exported: Iterable[tuple[str, object]], reference: Mapping[str, object]) -> list[str]:
    """Differences between exported ``(name, tensor)`` pairs and the HF tensors by name, compared in bf16."""
    import torch

    problems, seen = [], set()
    for name, tensor in exported:
        seen.add(name)
        ref = reference.get(name)
        if ref is None:
            problems.append(f"{name}: exported but not in the HF checkpoint")
        elif tuple(tensor.shape) != tuple(ref.shape):
            problems.append(f"{name}: shape {tuple(tensor.shape)} != HF {tuple(ref.shape)}")
        elif not torch.equal(tensor.detach().cpu().to(torch.bfloat16), ref.to(torch.bfloat16)):
            diff = (tensor.detach().cpu().float() - ref.to(torch.bfloat16).float()).abs().max().item()
            problems.append(f"{name}: values differ (max |diff| {diff:.3g} after bf16 rounding)")
    problems += [f"{name}: in the HF checkpoint but not exported" for name in sorted(set(reference) - seen)]
    return problems


def format_table(rows: list[tuple[str, str, float | None, str]]) -> tuple[str, bool]:
    """The pass/fail table of ``(step, PASS|FAIL|SKIP, seconds, detail)`` rows, and whether every step passed."""
    lines = ["| step | result | seconds | detail |", "|---|---|---|---|"]
    for step, status, seconds, detail in rows:
        lines.append(f"| {step} | {status} | {'' if seconds is None else f'{seconds:.0f}'} | "
                     f"{detail.replace('|', '/')} |")
    ok = bool(rows) and all(status == "PASS" for _, status, _, _ in rows)
    return "\n".join(lines + [f"gpu_check: {'PASS' if ok else 'FAIL'}"]), ok


def read_steps(path: str | os.PathLike) -> list[tuple[str, str, float | None, str]]:
    """The script's step records: one ``step<TAB>status<TAB>seconds<TAB>detail`` line each."""
    rows = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            step, status, seconds, detail = (line.split("\t", 3) + ["", "", ""])[:4]
            rows.append((step, status, float(seconds) if seconds else None, detail))
    return rows


SPEC_METRICS = ("rollout/spec_drafts", "rollout/spec_draft_tokens", "rollout/spec_accepted_tokens",
                "rollout/spec_draft_acceptance_rate", "rollout/spec_acceptance_length")


def smoke_problems(run_dir: str | os.PathLike, steps: int, spec: bool = False, accepted: bool = False) -> list[str]:
    """What the smoke run's logs lack: ``steps`` training steps in verl's file log, each with an actor update and
    the recipe's metrics, and a length trace per step; with ``spec`` (the speculative smoke runs) also speculative
    decoding's acceptance metrics on every step, with drafts (recipe/adapter/spec_metrics.py; a drafter that knows
    nothing of the tiny random model may see none accepted, so the acceptance itself may be 0); with ``accepted``
    (the tiny EAGLE-3 head, trained on that model, learning online) also accepted draft tokens over the steps and
    the online head's ``draft_head/*`` on every step (its capture, training and checked push ran on the GPU)."""
    from .traces import iter_jsonl, read_records

    run = Path(run_dir)
    logged: dict[int, dict] = {}
    for f in sorted((run / "logs").glob("metrics.*.jsonl")):
        for _, rec in iter_jsonl(f):  # None: a line cut short by a crash
            if isinstance(rec, dict) and "step" in rec:
                logged.setdefault(int(rec["step"]), {}).update(rec.get("data") or {})
    absent = [s for s in range(1, steps + 1) if s not in logged]
    problems = [f"no step {absent} in {run}/logs/metrics.*.jsonl"] if absent else []
    for step, data in sorted((s, d) for s, d in logged.items() if 1 <= s <= steps):
        missing = [k for k in ("rollout/response_max_tokens_cap", "sampler/epoch", "timing_s/gen") if k not in data]
        if not any(k.startswith("actor/") for k in data):
            missing.append("actor/* (no update)")
        if spec:
            missing += [k for k in SPEC_METRICS if k not in data]
            if SPEC_METRICS[0] in data and not data[SPEC_METRICS[0]] > 0:
                missing.append("speculative drafts (rollout/spec_drafts is 0)")
        if missing:
            problems.append(f"step {step}: no {', '.join(missing)}")
    online = [s for s, d in logged.items() if 1 <= s <= steps and "draft_head/optimizer_steps" in d]
    if accepted and len(online) != steps:
        problems.append(f"the online head (ROLLOUT_DRAFT_ONLINE=1) logged draft_head/* on steps {sorted(online)} of "
                        f"1-{steps}: no capture, training or push on the others")
    if accepted and not any(d.get(SPEC_METRICS[2], 0) > 0 for s, d in logged.items() if 1 <= s <= steps):
        problems.append(f"no accepted draft tokens in steps 1-{steps} ({SPEC_METRICS[2]} is 0 or absent): the head "
                        "never drafted a token the model sampled (a head for another model, or wrong hidden states)")
    traces = run / "length_traces.jsonl"
    traced = read_records(traces) if traces.is_file() else {}
    if untraced := [s for s in range(1, steps + 1) if s not in traced]:
        problems.append(f"no length trace for step {untraced} in {traces}")
    return problems


def spec_summary(run_dir: str | os.PathLike, steps: int) -> str:
    """The run's drafts, draft tokens and accepted tokens over its first ``steps`` steps, for the table, and those of
    its validations (``val-aux/spec_*``) when logged: verl validates greedily, where a trained head's drafts are
    accepted far more often than at the rollout's temperature 1 (near chance for the tiny random model)."""
    from .traces import iter_jsonl

    total = dict.fromkeys(SPEC_METRICS[:3], 0.0)
    val = {k.replace("rollout/", "val-aux/"): 0.0 for k in SPEC_METRICS[:3]}
    for f in sorted((Path(run_dir) / "logs").glob("metrics.*.jsonl")):
        for _, rec in iter_jsonl(f):
            if not isinstance(rec, dict):
                continue
            step, data = int(rec.get("step", -1)), rec.get("data") or {}
            for sums, first in ((total, 1), (val, 0)):  # the validation before training logs at step 0
                if first <= step <= steps:
                    for k in sums:
                        sums[k] += float(data.get(k, 0.0))
    d, t, a = total.values()
    out = (f"{d:.0f} drafts, {t:.0f} draft tokens, {a:.0f} accepted (rate {a / t if t else 0:.3f}, acceptance "
           f"length {1 + a / d if d else 1:.3f})")
    _, vt, va = val.values()
    if vt:
        out += f"; greedy validation: {va:.0f} of {vt:.0f} draft tokens accepted (rate {va / vt:.3f})"
    return out


def _init_single_rank() -> None:
    """One NCCL rank on GPU 0, as Megatron's parallel state needs (the converter does the same)."""
    import socket

    import torch

    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, value)
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    torch.cuda.set_device(0)
    torch.distributed.init_process_group("nccl")


def _megatron_engine(model_dir: str, distcp_dir: str):
    """verl's Megatron engine for the language model, loading ``distcp_dir`` the way the actor and the ref do."""
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import HFModelConfig, McoreEngineConfig, McoreOptimizerConfig
    from verl.workers.engine import EngineRegistry

    engine = EngineRegistry.new(
        model_type="language_model", backend="megatron",
        model_config=HFModelConfig(path=model_dir, load_tokenizer=False),
        engine_config=McoreEngineConfig(forward_only=True, use_dist_checkpointing=True,
                                        dist_checkpointing_path=distcp_dir, param_offload=False),
        optimizer_config=McoreOptimizerConfig(lr_decay_steps=10),  # read at build time even when forward-only
        checkpoint_config=CheckpointConfig(),
    )
    engine.initialize()
    return engine


def check_logits(model_dir: str, distcp_dir: str) -> list[tuple[str, str, str]]:
    """``(check, PASS|FAIL, detail)`` for the weights and the logits (one GPU)."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM
    from verl.utils.megatron_utils import unwrap_model

    _init_single_rank()
    try:
        engine = _megatron_engine(model_dir, distcp_dir)
        reference = {k: v for f in sorted(Path(model_dir).glob("*.safetensors")) for k, v in load_file(f).items()}
        exported, _ = engine.get_per_tensor_param()
        problems = weight_problems(exported, reference)
        results = [("weights", "FAIL" if problems else "PASS",
                    f"{len(problems)} problem(s): " + "; ".join(problems[:3]) if problems else
                    f"{len(reference)} tensors equal the HF checkpoint's in bf16")]

        vocab = AutoConfig.from_pretrained(model_dir).vocab_size
        ids = torch.randint(0, vocab, TOKENS_SHAPE, generator=torch.Generator().manual_seed(0)).cuda()
        positions = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
        model = unwrap_model(engine.module[0]).eval()
        hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda().eval()
        with torch.no_grad():
            # [batch, seq, padded vocab] with labels=None; Megatron may pad the vocab: compare the real entries
            out = model(input_ids=ids, position_ids=positions, attention_mask=None)[..., :vocab]
            ref = hf(input_ids=ids).logits
        ok, detail = logits_verdict(logit_metrics(ref, out))
        return results + [("logits", "PASS" if ok else "FAIL", detail)]
    finally:
        torch.distributed.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m recipe.gpu_check", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("tiny-model", help="print the smoke preset's tiny model dir (built once, CPU)")
    sub.add_parser("tiny-head", help="print the tiny model's EAGLE-3 head dir (trained once, CPU, ~2 min)")
    lg = sub.add_parser("logits", help="load DISTCP with verl's Megatron engine, compare with MODEL (one GPU)")
    lg.add_argument("--model", required=True)
    lg.add_argument("--distcp", required=True)
    sm = sub.add_parser("smoke-result", help="check the smoke run's metrics and traces")
    sm.add_argument("run_dir")
    sm.add_argument("--steps", type=int, required=True)
    sm.add_argument("--spec", action="store_true", help="also speculative decoding's acceptance metrics")
    sm.add_argument("--accepted", action="store_true", help="--spec, and accepted drafts (a trained head)")
    tb = sub.add_parser("table", help="print the pass/fail table of the script's step records")
    tb.add_argument("steps_file")
    args = ap.parse_args(argv)
    if args.cmd in ("tiny-model", "tiny-head"):
        from .smoke import N_TEST, N_TRAIN
        from .tiny.artifacts import tiny_artifacts
        from .tiny.eagle3_head import build_tiny_eagle3_head

        cache = os.environ.get("RECIPE_FIXTURE_CACHE") or None
        model = tiny_artifacts(cache, n_train=N_TRAIN, n_test=N_TEST).model_dir
        print(model if args.cmd == "tiny-model" else build_tiny_eagle3_head(model, cache))
        return 0
    if args.cmd == "logits":
        results = check_logits(os.path.abspath(args.model), os.path.abspath(args.distcp))
        print("; ".join(f"{check} {status}: {detail}" for check, status, detail in results), flush=True)
        return 0 if all(status == "PASS" for _, status, _ in results) else 1
    if args.cmd == "smoke-result":
        spec = args.spec or args.accepted
        problems = smoke_problems(args.run_dir, args.steps, spec=spec, accepted=args.accepted)
        done = f"{args.steps} steps logged with the recipe's metrics and traces"
        if not problems and spec:
            done += "; speculative acceptance: " + spec_summary(args.run_dir, args.steps)
        print("; ".join(problems) if problems else done)
        return 1 if problems else 0
    text, ok = format_table(read_steps(args.steps_file))
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
