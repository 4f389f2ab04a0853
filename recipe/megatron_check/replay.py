"""R3 (rollout routing replay) on the CPU: Megatron-Core replays the experts vLLM routed each token to.

verl's ``actor_rollout_ref.actor.megatron.router_replay.mode=R3`` feeds the actor the ``routed_experts`` vLLM returned
with each response, so the log-probs the loss uses come from the experts that generated the tokens. This check runs
the actor's replay path on recorded vLLM CPU rollouts (:func:`save_rollouts`, ``tests/megatron/test_router_replay.py``
records them): verl's ``apply_router_replay_patch`` before the model is built, ``moe_enable_routing_replay`` on its
config, and per sequence what ``MegatronEngine.forward_step`` does in R3 mode: ``align_r3_router_replay_data`` (vLLM
has no row for the last token: a placeholder), ``build_r3_replay_mask`` (that row keeps Megatron's own routing),
``set_router_replay_data``, action ``REPLAY_FORWARD``. A hook on every router records the experts its routing map
sends each token to; they are compared with vLLM's as sets per (token, layer), and the sampled tokens' log-probs with
vLLM's (mean |difference| over response tokens). Each comparison runs with replay and with Megatron's own routing:

- ``r3-same-weights``: the Hugging Face weights vLLM served;
- ``r3-shifted-routes-detected``: the routes replayed one token early and one token late must mismatch;
- ``r3-after-optimizer-step``: after one AdamW step on the sequences (the policy moved since the rollout, as in
  any off-policy step): Megatron's own routing departs from vLLM's, the replayed one must not;
- ``r3-recipe-paths`` (with ``--paths``): each trajectory recorded through the recipe's agent loops
  (``recipe.route_record.paths``: capped, cut, resumed, handed back, multi-turn) against routes this check did not
  record: Megatron's own routing of the trajectory's tokens with the weights vLLM served, before any update (an
  independent forward), must be the recorded routes row for row (``ALIGNED_SHARE``), and the same routes shifted one
  token early or late must not be, so a path that hands Megatron routes off by one token fails here (replay alone
  cannot see it: it routes by whatever it is given). Then, after one AdamW step at lr 1e-3, replayed, every route
  is the recorded one while Megatron's own routing departs (docs/results.md, "Every recipe path", has the numbers);
- ``r3-megatron-bf16``: the same weights, Megatron's model cast to bf16 (vLLM CPU stays fp32), the numeric
  training/inference mismatch R3 is for on a GPU: Megatron's own routing must depart from vLLM's and the replayed
  one must not. The log-prob gaps are reported, not compared: bf16 rounds every weight, and replay changes only the
  few tokens whose routing flipped, so it narrows the gap on some trajectories and not on others.

Measured on the tiny Qwen3-MoE (4 layers, 8 experts, top-2), 3 rollouts sampled at temperature 1 (prompts of 7, 23,
41 tokens, responses of 32, 24, 40): 164 tokens with a vLLM row x 4 layers = 656 (token, layer) routes per comparison.

- same weights, fp32: 0 of 656 routes differ with and without replay; mean |dlogprob| 1.4e-7 both;
- routes shifted by +1 / -1 token: 454 of 656 (69%) differ, mean |dlogprob| 0.018 / 0.016 (aligned: 1.4e-7);
- one AdamW step at lr 1e-5 / 1e-4 / 1e-3: without replay 11 (1.7%) / 99 (15%) / 393 (60%) routes differ, with
  replay 0; mean |dlogprob| 0.0116 / 0.110 / 0.382 without, 0.0118 / 0.111 / 0.389 with: a step trained on these
  very tokens moves every log-prob, and replay pins the routing, not the weights, so it does not shrink that gap;
- Megatron in bf16: without replay 10 (1.5%) routes differ, mean |dlogprob| 0.0023; with replay 0 and 0.0016 (on
  the multi-turn trajectories, 2,216 routes: 34 and 0.00278 without, 0 and 0.00284 with).
- the recipe's paths against Megatron's own forward at the served weights: 0 of 144 / 136 / 364 / 144 routes differ
  (capped, cut, resumed, handed back; multi-turn on the trained model 0 of 1100 each), the same routes shifted one
  token 67-75% (88%); with the resumed path's routes shifted one token in the file, 274 of 364 differ and the row
  fails (the check before it compared the replayed routes with themselves and passed that file).

The command takes ~20 s on 2 cores (15 s of it imports); the test, with the vLLM engine recording, ~75 s.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import model as M
from .steps import Check

LRS = (1e-5, 1e-4, 1e-3)  # one AdamW step at each: steps.train uses 1e-3
# r3-recipe-paths: the share of a path's (token, layer) routes Megatron's own forward may route otherwise at the weights
# vLLM served. On the CPU both sides are fp32 and route alike (0 of 656, r3-same-weights); Megatron in bf16 on a GPU
# departs from the fp32 routes at near-ties (10 of 656, 1.5%, r3-megatron-bf16). A one-token shift moves 69%.
ALIGNED_SHARE = {"cpu": 0.0, "gpu": 0.05}
SHIFTED_SHARE = 0.25  # what the same routes shifted one token must at least mismatch (else the check sees nothing)


@dataclass
class Rollout:
    tokens: np.ndarray  # prompt + response token ids
    prompt_len: int
    routes: np.ndarray  # vLLM's routed experts: (len(tokens) - 1, layers, top_k)
    logprobs: np.ndarray  # vLLM's log-prob of each response token

    @property
    def response_len(self) -> int:
        return len(self.tokens) - self.prompt_len


    @classmethod
    def of_vllm(cls, o) -> "Rollout":
        """A vLLM ``RequestOutput`` requested with ``logprobs=0`` and routed experts."""
        out = o.outputs[0]
        return cls(np.array(list(o.prompt_token_ids) + list(out.token_ids), dtype=np.int64), len(o.prompt_token_ids),
                   out.routed_experts,
                   np.array([lp[t].logprob for t, lp in zip(out.token_ids, out.logprobs, strict=True)]))

    @classmethod
    def of_agent_loop(cls, prompt: list[int], response: list[int], routes: np.ndarray, logprobs: list[float],
                      mask: list[int]):
        """A trajectory as the recipe's agent loop hands it to verl's worker (``AgentLoopOutput`` fields); tokens
        outside the loss (tool replies) have no rollout log-prob: NaN, left out of the log-prob gap."""
        lp = np.where(np.array(mask) == 1, np.array(logprobs, dtype=np.float64), np.nan)
        return cls(np.array(prompt + response, dtype=np.int64), len(prompt), routes, lp)


def save_rollouts(path: Path, rollouts: list[Rollout], names: list[str] | None = None) -> None:
    """``rollouts`` (named, e.g. by the recipe path that recorded them) as one ``.npz``."""
    arrays = {}
    for i, r in enumerate(rollouts):
        arrays.update({f"tokens{i}": r.tokens, f"prompt_len{i}": np.array(r.prompt_len), f"routes{i}": r.routes,
                       f"logprobs{i}": r.logprobs, f"name{i}": np.array(names[i] if names else str(i))})
    np.savez(path, **arrays)


def load_rollouts(path: Path) -> dict[str, Rollout]:
    with np.load(path) as f:
        return {str(f[f"name{i}"]): Rollout(f[f"tokens{i}"], int(f[f"prompt_len{i}"]), f[f"routes{i}"],
                                            f[f"logprobs{i}"])
                for i in range(sum(k.startswith("tokens") for k in f.files))}


@contextlib.contextmanager
def routes_used(model):
    """Yields a dict that a forward fills, per layer index, with the routing map (tokens x experts) its router
    returned: the experts the dispatcher sends each token to, whichever way the router chose them."""
    routers = [layer.mlp.router for layer in M.unwrapped(model).decoder.layers]
    seen = {}
    hooks = [r.register_forward_hook(lambda _m, _in, out, i=i: seen.__setitem__(i, out[1]))
             for i, r in enumerate(routers)]
    try:
        yield seen
    finally:
        for hook in hooks:
            hook.remove()


def forward(model, rollout: Rollout, device: str, replay: np.ndarray | None = None, grad: bool = False):
    """Megatron's routes ``(tokens, layers, top_k)`` (sorted) and the response tokens' log-probs for one rollout;
    with ``replay`` (vLLM-layout routes) through verl's R3 path as ``MegatronEngine.forward_step`` runs it."""
    import torch
    from verl.utils.megatron.router_replay_patch import RouterReplay, RouterReplayAction
    from verl.utils.megatron.router_replay_utils import (align_r3_router_replay_data, build_r3_replay_mask,
                                                         set_router_replay_data)

    ids = torch.as_tensor(rollout.tokens, device=device)
    n = len(ids)
    unwrapped = M.unwrapped(model)
    if replay is not None:
        input_ids = torch.nested.as_nested_tensor([ids], layout=torch.jagged)
        routes = torch.nested.as_nested_tensor([torch.as_tensor(replay.astype(np.int16), device=device)],
                                               layout=torch.jagged)
        response_mask = torch.ones(1, rollout.response_len, dtype=torch.int64, device=device)
        RouterReplay.set_global_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
        set_router_replay_data(align_r3_router_replay_data(routes, input_ids), None, unwrapped.config, 0,
                               replay_mask=build_r3_replay_mask(input_ids, response_mask), model=unwrapped)
    mask = torch.triu(torch.ones(n, n, device=device), diagonal=1).bool()[None, None]
    try:
        with routes_used(model) as seen, contextlib.nullcontext() if grad else torch.no_grad():
            logits = model[0](input_ids=ids[None], position_ids=torch.arange(n, device=device)[None],
                              attention_mask=mask)
    finally:
        RouterReplay.clear_global_indices()
        RouterReplay.clear_global_router_replay_action()
    k = unwrapped.config.moe_router_topk
    used = torch.stack([seen[i].nonzero()[:, 1].view(n, k) for i in range(len(seen))], dim=1)
    logprobs = torch.log_softmax(logits[0, :, :unwrapped.vocab_size].float(), -1)
    picked = logprobs[rollout.prompt_len - 1:-1].gather(-1, ids[rollout.prompt_len:, None])[:, 0]
    return used.cpu().numpy(), picked


def compare(model, rollouts: list[Rollout], device: str, replays=None) -> dict:
    """Megatron vs vLLM over ``rollouts``: (token, layer) routes compared (every token vLLM has a row for) and
    mismatched as sets, and the mean |log-prob difference| over the response tokens that have a rollout log-prob."""
    routes = mismatched = 0
    gaps = []
    for r, replay in zip(rollouts, replays or [None] * len(rollouts), strict=True):
        used, logprobs = forward(model, r, device, replay)
        wrong = (used[:-1] != np.sort(r.routes.astype(np.int64), axis=-1)).any(-1)
        routes, mismatched = routes + wrong.size, mismatched + int(wrong.sum())
        gaps.append(np.abs(logprobs.detach().cpu().numpy() - r.logprobs))
    return {"routes": routes, "mismatched": mismatched, "mismatch_share": mismatched / routes,
            "logprob_gap": float(np.nanmean(np.concatenate(gaps)))}


def both(model, rollouts, device) -> dict:
    """:func:`compare` with Megatron's own routing and with vLLM's replayed."""
    return {"native": compare(model, rollouts, device), "replay": compare(model, rollouts, device,
                                                                          [r.routes for r in rollouts])}


def aligned(model, rollout: Rollout, device: str) -> dict:
    """A recorded trajectory's routes against Megatron's own routing of its tokens (one forward, no replay), over
    the rows it has (up to prompt + response - 1); and, as the control, the same routes moved one token early and
    late (``shifted``): the least share of those that differ."""
    used, _ = forward(model, rollout, device)
    rows = min(len(rollout.routes), len(used) - 1)

    def wrong(routes):
        return (used[:rows] != np.sort(routes[:rows].astype(np.int64), axis=-1)).any(-1)

    own = wrong(rollout.routes)
    return {"routes": own.size, "mismatched": int(own.sum()), "mismatch_share": float(own.mean()),
            "shifted_share": min(float(wrong(shifted(rollout.routes, by)).mean()) for by in (1, -1))}


def _detail(data: dict) -> str:
    return "; ".join(f"{arm}: {d['mismatched']}/{d['routes']} routes differ, mean abs dlogprob {d['logprob_gap']:.3g}"
                     for arm, d in data.items())


def shifted(routes: np.ndarray, by: int) -> np.ndarray:
    """``routes`` moved ``by`` tokens (row ``i`` gets row ``i + by``'s), edge rows repeated: same shape."""
    idx = np.clip(np.arange(len(routes)) + by, 0, len(routes) - 1)
    return routes[idx]


def optimizer_step(model, rollouts: list[Rollout], device: str, lr: float) -> float:
    """One AdamW step on the sequences' mean response negative log-likelihood, Megatron's own routing."""
    import torch

    opt = torch.optim.AdamW([p for chunk in model for p in chunk.parameters()], lr=lr)
    loss = -torch.cat([forward(model, r, device, grad=True)[1] for r in rollouts]).mean()
    loss.backward()
    opt.step()
    return loss.item()


def check(c: Check, rollouts_path: Path, paths_path: Path | None = None) -> None:
    """The ``r3-*`` rows (module docstring) on the model Megatron-Bridge loads from ``c.state['model_dir']``; with
    ``paths_path``, ``r3-recipe-paths`` too."""
    from verl.utils.megatron import router_replay_utils
    from verl.utils.megatron.router_replay_patch import apply_router_replay_patch

    if c.cpu:  # verl's platform falls back to "cuda" without an accelerator; the routes move to this device
        router_replay_utils.device_name = "cpu"
    rollouts = list(load_rollouts(rollouts_path).values())
    model_dir = str(c.state["model_dir"])
    apply_router_replay_patch()  # before the routers are built, as MegatronEngine.__init__ does
    bridge, p = M.provider(model_dir, c.cpu)
    p.moe_enable_routing_replay = True  # what verl sets on the finalized config
    model = M.build(p, c.cpu, seed=1)
    bridge.load_hf_weights(model, model_dir)

    def same_weights():
        data = both(model, rollouts, c.device)
        ok = data["replay"]["mismatched"] == 0 and data["native"]["mismatched"] == 0
        return ok, _detail(data), data

    def shift():
        data = {f"by{by:+d}": compare(model, rollouts, c.device, [shifted(r.routes, by) for r in rollouts])
                for by in (1, -1)}
        return all(d["mismatch_share"] > 0.25 for d in data.values()), _detail(data), data

    def after_step():
        data = {}
        for lr in LRS:
            bridge.load_hf_weights(model, model_dir)  # each step from the weights vLLM served
            loss = optimizer_step(model, rollouts, c.device, lr)
            data[f"lr={lr:g}"] = {**both(model, rollouts, c.device), "loss": loss}
        ok = all(d["replay"]["mismatched"] == 0 and d["native"]["mismatched"] > 0 for d in data.values())
        return ok, "; ".join(f"{k}: {_detail({a: d[a] for a in ('native', 'replay')})}" for k, d in data.items()), data

    def bf16():
        import torch

        bridge.load_hf_weights(model, model_dir)
        for chunk in model:
            chunk.to(torch.bfloat16)
        data = both(model, rollouts, c.device)
        ok = data["replay"]["mismatched"] == 0 and data["native"]["mismatched"] > 0
        return ok, _detail(data), data

    def recipe_paths():
        paths = load_rollouts(paths_path)
        bridge.load_hf_weights(model, model_dir)  # the weights vLLM served: Megatron's own forward is the reference
        independent = {name: aligned(model, r, c.device) for name, r in paths.items()}
        optimizer_step(model, rollouts, c.device, LRS[-1])  # the policy moved: its own routing departs from vLLM's
        data = {name: {"independent": independent[name], **both(model, [r], c.device)} for name, r in paths.items()}
        limit = ALIGNED_SHARE["cpu" if c.cpu else "gpu"]
        misaligned = [k for k, d in independent.items()
                      if d["mismatch_share"] > limit or d["shifted_share"] < SHIFTED_SHARE]
        ok = not misaligned and all(d["replay"]["mismatched"] == 0 for d in data.values()) and \
            sum(d["native"]["mismatched"] for d in data.values()) > 0
        detail = "; ".join(
            f"{k}: {d['independent']['mismatched']}/{d['independent']['routes']} routes differ from Megatron's own "
            f"forward at the served weights (shifted one token: {d['independent']['shifted_share']:.0%}), after a "
            f"step {_detail({a: d[a] for a in ('native', 'replay')})}" for k, d in data.items())
        return ok, (f"NOT ALIGNED: {', '.join(misaligned)}; " if misaligned else "") + detail, data

    c.run("r3-same-weights", same_weights)
    c.run("r3-shifted-routes-detected", shift)
    c.run("r3-after-optimizer-step", after_step)
    if paths_path is not None:
        c.run("r3-recipe-paths", recipe_paths)
    c.run("r3-megatron-bf16", bf16)  # last: the model stays in bf16
