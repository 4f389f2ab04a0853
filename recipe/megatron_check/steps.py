"""The steps of the Megatron check (see the package docstring), each recorded as a PASS/FAIL row with its numbers.

A failed step is recorded and the later steps that do not need its result still run, so one run says everything it
can. Rows carry their numbers in ``data`` (the tests assert on them, the device run's table prints them).
"""
from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from . import model as M


@dataclass
class Row:
    step: str
    ok: bool
    detail: str
    seconds: float = 0.0
    data: dict = field(default_factory=dict)


@dataclass
class Check:
    work: Path
    cpu: bool
    rows: list[Row] = field(default_factory=list)
    state: dict = field(default_factory=dict)

    @property
    def device(self) -> str:
        return "cpu" if self.cpu else "cuda"

    def run(self, step: str, fn) -> None:
        """Run ``fn() -> (ok, detail, data)`` as ``step``; an exception is a failed row with its message."""
        start = time.time()
        try:
            ok, detail, data = fn()
        except Exception as e:  # noqa: BLE001 - every failure becomes a row; the traceback goes to stderr
            traceback.print_exc()
            ok, detail, data = False, f"{type(e).__name__}: {str(e)[:400]}", {}
        row = Row(step, bool(ok), detail, time.time() - start, data)
        self.rows.append(row)
        print(f"[{step}] {'PASS' if row.ok else 'FAIL'} ({row.seconds:.1f} s): {detail}", file=sys.stderr, flush=True)

    def dump(self, path: Path) -> None:
        path.write_text(json.dumps([vars(r) for r in self.rows], indent=1))


def with_routing(model_dir: Path, out: Path, norm_topk_prob: bool) -> Path:
    """A copy of ``model_dir`` (symlinked weights) whose config sets ``norm_topk_prob``."""
    if not out.exists():
        out.mkdir(parents=True)
        for f in model_dir.iterdir():
            (out / f.name).symlink_to(f.resolve())
        (out / "config.json").unlink()
        cfg = json.loads((model_dir / "config.json").read_text())
        cfg["norm_topk_prob"] = norm_topk_prob
        (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


def verl_converter():
    """verl 0.9.1's ``scripts/converter_hf_to_mcore.py`` (the wheel ships it beside ``verl/``), loaded by path."""
    import verl

    path = Path(verl.__path__[0]).parent / "scripts" / "converter_hf_to_mcore.py"
    spec = importlib.util.spec_from_file_location("verl_converter_hf_to_mcore", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bridge_logits(c: Check) -> None:
    """Megatron-Bridge model vs Hugging Face, for the fixture and for a copy with unnormalised top-k routing."""
    from ..gpu_check import logit_metrics, logits_verdict

    model_dir = c.state["model_dir"]
    cfg = json.loads((model_dir / "config.json").read_text())
    c.state["batch"] = batch = M.Batch(cfg["vocab_size"], c.device)

    def check(d: Path, seed: int):
        bridge, p = M.provider(str(d), c.cpu)
        model = M.build(p, c.cpu, seed=seed)
        bridge.load_hf_weights(model, str(d))
        metrics = logit_metrics(M.hf_logits(str(d), batch, c.device), batch.logits(model))
        return bridge, p, model, metrics

    def fixture():
        bridge, p, model, metrics = check(model_dir, seed=1)
        ok, detail = logits_verdict(metrics)
        c.state.update(bridge=bridge, provider=p, ref_model=model, ref_logits=batch.logits(model))
        return ok, f"norm_topk_prob={cfg.get('norm_topk_prob')}: {detail}", metrics

    def unnormalised():
        d = with_routing(model_dir, c.work / "tiny-norm-topk-false", norm_topk_prob=False)
        *_, metrics = check(d, seed=1)
        ok, detail = logits_verdict(metrics)
        # Megatron-Bridge's Qwen3-MoE mapping always renormalises the top-k weights: this copy must fail the check
        return not ok, f"norm_topk_prob=false (must fail): {detail}", metrics

    c.run("bridge-logits", fixture)
    c.run("bridge-unnormalised-routing-detected", unnormalised)


def convert(c: Check) -> None:
    """verl's converter mapping into a fresh model equals the bridge's load, tensor for tensor."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    def step():
        d = str(c.state["model_dir"])
        hf = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32 if c.cpu else torch.bfloat16)
        model = M.build(c.state["provider"], c.cpu, seed=2)
        copied = verl_converter().convert_checkpoint_from_transformers_to_megatron(
            hf, M.converter_view(M.unwrapped(model)), AutoConfig.from_pretrained(d))
        ref = dict(M.unwrapped(c.state["ref_model"]).named_parameters())
        params = dict(M.unwrapped(model).named_parameters())
        differ = [k for k, v in params.items() if not torch.equal(v.detach().cpu(), ref[k].detach().cpu())]
        c.state["converted"] = model
        total = hf.num_parameters()
        return (not differ and copied == total and set(params) == set(ref),
                f"{copied} of {total} HF parameters copied into {len(params)} tensors; {len(differ)} differ from the "
                f"bridge's: {differ[:4]}", {"copied": copied, "hf_parameters": total, "differ": differ})

    c.run("convert-mapping", step)


def save_distcp(model, path: Path) -> None:
    """What verl's converter does after the mapping: one ``dist_checkpointing.save`` of the sharded state dict (a
    collective: every rank calls it; rank 0 makes the empty directory first)."""
    import torch.distributed as dist
    from megatron.core import dist_checkpointing

    if dist.get_rank() == 0:
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
    dist.barrier()
    dist_checkpointing.save(M.unwrapped(model).sharded_state_dict(), str(path), sharded_strategy=None,
                            async_sharded_save=False)


def load_matches_reference(c: Check, path: Path, seed: int) -> tuple[bool, dict]:
    """verl's ``load_mcore_dist_weights`` (the actor's and ref's load) into a fresh model: every parameter and the
    logits against the reference model."""
    import torch
    from verl.utils.model import load_mcore_dist_weights

    fresh = M.build(c.state["provider"], c.cpu, seed=seed)
    before = (c.state["batch"].logits(fresh) - c.state["ref_logits"]).abs().max().item()
    load_mcore_dist_weights(fresh, str(path), is_value_model=False)
    after = (c.state["batch"].logits(fresh) - c.state["ref_logits"]).abs().max().item()
    ref = dict(M.unwrapped(c.state["ref_model"]).named_parameters())
    differ = [k for k, v in M.unwrapped(fresh).named_parameters() if not torch.equal(v, ref[k])]
    return after == 0.0 and not differ and before > 0, {"max_dlogit_before": before, "max_dlogit_after": after,
                                                       "differ": differ}


def distcp(c: Check) -> None:
    """The converter's save, the preflight's completeness check, verl's loader: bitwise identical logits."""
    from ..preflight.distcp import distcp_problem

    def step():
        path = c.work / "distcp"
        save_distcp(c.state.get("converted") or c.state["ref_model"], path)
        problem = distcp_problem(str(path))
        broken = c.work / "distcp-without-metadata"
        shutil.rmtree(broken, ignore_errors=True)
        shutil.copytree(path, broken)
        (broken / "metadata.json").unlink()
        broken_problem = distcp_problem(str(broken))
        same, data = load_matches_reference(c, path, seed=3)
        c.state["distcp"] = path
        data.update(files=sorted(p.name for p in path.iterdir()), problem=problem, broken_problem=broken_problem)
        return (same and problem is None and broken_problem is not None,
                f"preflight: {problem!r}, without metadata.json: {broken_problem!r}; max |dlogit| fresh "
                f"{data['max_dlogit_before']:.3g} -> loaded {data['max_dlogit_after']:.3g}", data)

    c.run("distcp-save-load", step)


def reshard_load(c: Check, saved: Path) -> None:
    """Checkpoints saved by ``reshard-save`` at other layouts, each loaded at TP = EP = 1."""
    for path in sorted(p for p in saved.iterdir() if p.is_dir()):
        def step(path=path):
            same, data = load_matches_reference(c, path, seed=4)
            return same, f"saved at {path.name}, loaded at tp1-ep1: {len(data['differ'])} tensors differ, max " \
                         f"|dlogit| {data['max_dlogit_after']:.3g}", data
        c.run(f"reshard-{path.name}-to-tp1-ep1", step)


def _optimizer(c: Check, model):
    """Megatron's distributed optimizer on a GPU (verl's actor: ``use_distributed_optimizer=True``). On the CPU plain
    AdamW: Megatron's optimizers put their scalars on ``device='cuda'`` and check ``torch.cuda.*Tensor`` types."""
    import torch

    if c.cpu:
        return torch.optim.AdamW([p for chunk in model for p in chunk.parameters()], lr=1e-3)
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    return get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-3, bf16=True, use_distributed_optimizer=True,
                                                  clip_grad=1.0), model)


def _train_step(c: Check, model, opt) -> float:
    if not c.cpu:
        for chunk in model:
            chunk.zero_grad_buffer()
    opt.zero_grad()
    loss = c.state["batch"].loss(model)
    loss.backward()
    if c.cpu:
        opt.step()
        return loss.item()
    for chunk in model:
        chunk.finish_grad_sync()
    ok, grad_norm, _ = opt.step()
    if not ok or grad_norm != grad_norm:
        raise RuntimeError(f"optimizer step failed (grad norm {grad_norm})")
    return loss.item()


def train(c: Check, steps: int = 3) -> None:
    """Training steps from the dist checkpoint on a fixed batch: finite losses that fall. On a GPU with Megatron's DDP
    and distributed optimizer, as verl's actor."""
    from verl.utils.model import load_mcore_dist_weights

    def step():
        model = M.build(c.state["provider"], c.cpu, seed=5, ddp=not c.cpu)
        load_mcore_dist_weights(model, str(c.state["distcp"]), is_value_model=False)
        opt = _optimizer(c, model)
        for chunk in model:
            chunk.train()
        losses = [_train_step(c, model, opt) for _ in range(steps)]
        c.state.update(train_model=model, optimizer=opt)
        return (all(x == x for x in losses) and losses[-1] < losses[0], f"losses {[round(x, 4) for x in losses]} "
                f"({'AdamW' if c.cpu else 'DDP + distributed optimizer'})", {"losses": losses})

    c.run("train", step)


def resume(c: Check) -> None:
    """verl's ``MegatronCheckpointManager`` (what ``SAVE_CKPT_ENABLE=1`` saves) save -> a fresh model -> load. On a
    GPU model, optimizer and extra (RNG) states, and the next step's loss must equal the uninterrupted run's; on the
    CPU the model part (the optimizer needs Megatron's, see :func:`_optimizer`): every parameter equal."""
    import torch
    from omegaconf import OmegaConf
    from transformers import AutoConfig
    from verl.utils.checkpoint.megatron_checkpoint_manager import MegatronCheckpointManager

    contents = ["model"] if c.cpu else ["model", "optimizer", "extra"]

    def manager(model, opt):
        cfg = OmegaConf.create({"model": {"path": str(c.state["model_dir"])}, "megatron": {
            "dist_ckpt_optim_fully_reshardable": False, "distrib_optim_fully_reshardable_mem_efficient": False}})
        ckpt = OmegaConf.create({"save_contents": contents, "load_contents": contents, "async_save": False,
                                 "strict": True, "mbridge_config": {}})
        hf = AutoConfig.from_pretrained(str(c.state["model_dir"]))
        return MegatronCheckpointManager(
            config=cfg, checkpoint_config=ckpt, model_config=hf, transformer_config=M.unwrapped(model).config,
            role="actor", model=model, arch=hf.architectures[0], hf_config=hf,
            param_dtype=torch.float32 if c.cpu else torch.bfloat16, share_embeddings_and_output_weights=False,
            processing_class=None, optimizer=None if c.cpu else opt, optimizer_scheduler=None,
            use_distributed_optimizer=not c.cpu, use_dist_checkpointing=True, bridge=c.state["bridge"],
            provider=c.state["provider"])

    def step():
        path = c.work / "resume" / "global_step_3" / "actor"
        trained = c.state["train_model"]
        manager(trained, c.state["optimizer"]).save_checkpoint(str(path), global_step=3)
        saved = {k: v.detach().clone() for k, v in M.unwrapped(trained).named_parameters()}
        uninterrupted = _train_step(c, trained, c.state["optimizer"])
        model = M.build(c.state["provider"], c.cpu, seed=6, ddp=not c.cpu)
        opt = None if c.cpu else _optimizer(c, model)
        fresh = [k for k, v in M.unwrapped(model).named_parameters() if not torch.equal(v, saved[k])]
        manager(model, opt).load_checkpoint(str(path))
        differ = [k for k, v in M.unwrapped(model).named_parameters() if not torch.equal(v, saved[k])]
        data = {"contents": contents, "differ": differ, "differ_before_load": len(fresh),
                "saved": sorted(p.name for p in path.iterdir())}
        detail = (f"saved {contents}: {len(differ)} of {len(saved)} tensors differ after load ({len(fresh)} before)")
        if c.cpu:
            return not differ and fresh, detail, data
        for chunk in model:
            chunk.train()
        resumed = _train_step(c, model, opt)
        # a GPU's backward may reduce in another order (atomics): 1e-5 relative
        same = abs(resumed - uninterrupted) <= 1e-5 * max(1.0, abs(uninterrupted))
        data.update(uninterrupted=uninterrupted, resumed=resumed)
        return (not differ and fresh and same, f"{detail}; next step's loss uninterrupted {uninterrupted:.8f}, resumed "
                f"{resumed:.8f}", data)

    c.run("resume-checkpoint-manager", step)
