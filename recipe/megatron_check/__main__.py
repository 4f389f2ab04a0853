"""``python -m recipe.megatron_check``: the Megatron check (package docstring) as one command.

    python -m recipe.megatron_check run --work DIR [--cpu] [--json FILE] [--resharded DIR]
    python -m recipe.megatron_check replay --work DIR --rollouts FILE.npz [--paths FILE.npz] [--cpu] [--json FILE]
    torchrun --nproc_per_node 2 -m recipe.megatron_check reshard-save --work DIR --cpu

``run`` prints the table of rows and exits 0 only when every row passed. ``--cpu`` is the rehearsal on a CPU build of
torch (gloo, fp32, :mod:`.cpu_cuda`); without it: one GPU, NCCL, bf16. ``reshard-save`` writes, under ``DIR``, one
dist checkpoint per layout of its ranks (TP 2, then EP 2), from the Hugging Face weights through Megatron-Bridge;
``run --resharded DIR`` loads each at TP = EP = 1 and compares it with the reference model. ``replay``: R3 routing
replay of recorded vLLM rollouts (:mod:`.replay`).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


def _init_distributed(cpu: bool) -> None:
    """torchrun's rendezvous when it launched us; alone, an in-process store: a one-rank world needs no TCP port, and
    a port picked here could be taken by a neighbour before the store binds it (it was, in CI beside other tests)."""
    import torch
    import torch.distributed as dist

    launched = "WORLD_SIZE" in os.environ
    os.environ.setdefault("LOCAL_RANK", "0")
    if cpu:
        from . import cpu_cuda

        cpu_cuda.install()
    else:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    backend = "gloo" if cpu else "nccl"
    if launched:
        dist.init_process_group(backend)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)


def _model_dir(args) -> Path:
    if args.model:
        return Path(args.model)
    from ..tiny.artifacts import build_tiny_qwen3_moe

    return build_tiny_qwen3_moe()


def run(args) -> int:
    from ..gpu_check import format_table
    from . import imports, replay, steps
    from .model import Layout, init_parallel

    start = time.time()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    check = steps.Check(work=work, cpu=args.cpu)

    def environment():
        versions = imports.prepare()
        _init_distributed(args.cpu)
        init_parallel(Layout(), args.cpu)
        check.state["model_dir"] = _model_dir(args)
        return True, ", ".join(f"{k} {v}" for k, v in versions.items()), versions

    check.run("environment", environment)
    if check.rows[-1].ok and args.cmd == "replay":
        replay.check(check, Path(args.rollouts), Path(args.paths) if args.paths else None)
    elif check.rows[-1].ok:
        steps.bridge_logits(check)
    if "provider" in check.state:
        steps.convert(check)
        steps.distcp(check)
        if args.resharded:
            steps.reshard_load(check, Path(args.resharded))
        if "distcp" in check.state:
            steps.train(check)
        if "optimizer" in check.state:
            steps.resume(check)
    if args.json:
        check.dump(Path(args.json))
    table, ok = format_table([(r.step, "PASS" if r.ok else "FAIL", r.seconds, r.detail) for r in check.rows])
    print(table + f" ({'CPU rehearsal' if args.cpu else 'GPU'}, {time.time() - start:.0f} s)")
    out = os.environ.get("OUT")  # the device tool brings back what is written there
    if out:
        Path(out, "megatron_check.md").write_text(table + "\n")
    return 0 if ok else 1


def reshard_save(args) -> int:
    import torch.distributed as dist

    from . import imports, steps
    from .model import Layout, build, init_parallel, provider

    imports.prepare()
    _init_distributed(args.cpu)
    world = dist.get_world_size()
    model_dir = str(_model_dir(args))
    for layout in (Layout(tp=world), Layout(ep=world)):
        init_parallel(layout, args.cpu)
        bridge, p = provider(model_dir, args.cpu, layout)
        model = build(p, args.cpu, seed=7)
        bridge.load_hf_weights(model, model_dir)
        steps.save_distcp(model, Path(args.work) / layout.name)
        print(f"reshard-save: rank {dist.get_rank()} saved {layout.name}", file=sys.stderr, flush=True)
    dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m recipe.megatron_check", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("run", "reshard-save", "replay"):
        p = sub.add_parser(name)
        p.add_argument("--work", required=True, help="a directory for the checkpoints (created)")
        p.add_argument("--cpu", action="store_true", help="the CPU rehearsal (gloo, fp32)")
        p.add_argument("--model", help="a Hugging Face Qwen3-MoE dir (default: the tiny fixture, built if needed)")
        if name != "reshard-save":
            p.add_argument("--json", help="write the rows as JSON here")
        if name == "run":
            p.add_argument("--resharded", help="a reshard-save --work dir: load each checkpoint in it at TP=EP=1")
        if name == "replay":
            p.add_argument("--rollouts", required=True, help="vLLM rollouts with routes (replay.save_rollouts)")
            p.add_argument("--paths", help="rollouts recorded through the recipe's agent loop, one per path "
                                            "(recipe.route_record.paths): replayed after one optimizer step")
    args = ap.parse_args(argv)
    return reshard_save(args) if args.cmd == "reshard-save" else run(args)


if __name__ == "__main__":  # dist_checkpointing's writer may spawn processes that re-import __main__
    sys.exit(main())
