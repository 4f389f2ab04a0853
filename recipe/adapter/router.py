"""Group affinity routing (``ROLLOUT_GROUP_AFFINITY=1``, on by default with ``ROLLOUT_SPECULATIVE=group``): every
response of a GRPO group on one vLLM replica, and a prompt's groups on the same replica epoch after epoch.

verl 0.9.1's router (``verl/workers/rollout/router.py`` ``GlobalRequestLoadBalancer``) sends each request to the
least-loaded replica (sticky only per ``request_id``, i.e. per trajectory), so a group's n responses scatter over the
replicas. The group drafter (``ROLLOUT_SPECULATIVE=group``) drafts from the running siblings and the prompt's earlier
groups in one engine's corpus, so the recipe routes by group: a prompt's home is a rendezvous hash of the prompt over
the replicas' ranks (``home_server``), its group goes there and its siblings follow, epoch after epoch, where its
history is. A load guard sends a request (and the rest of its group after it) to the least-loaded replica instead
when the group's replica holds more than ``max_excess`` in-flight requests above the least-loaded one: checked per
request, so a group can split mid-way; home stays where it is. A group is its prompt: siblings share ``prompt_ids``
(verl's ``LLMServerClient.generate`` hands them to the router when it asks for them, ``require_acquire_fields``); a
request whose prompt_ids carry more than the prompt (a resumed response's continuation, a routes re-prefill) names
its group's prompt length in its request id (``group_request_id``).

Homes are computed, not remembered: a replica's rank is its place in the pool verl builds the router with (verl
orders it by ``replica_rank``), so a restart with the same replicas, even on new addresses, finds every prompt's
home where it was (the engines' corpora, though, start empty: the first epoch after a resume drafts without history);
a replica that leaves the pool re-homes only its own prompts, each to its next choice, and they stay there; one that
joins takes ~1/replicas of the prompts. Nothing grows with the dataset. The guard's effect (fully home, split, moved)
is modelled by ``recipe/sim/routing.py`` and checked against this class on the same arrivals
(``tests/sim/test_routing.py``).

Why a stable home and not a corpus shared by the node or history replicated to every replica: the simulator at the
users' scale (``bench/group_affinity.py --placement``: 17.4k prompts, n=16, 4 replicas of TP4) finds it the fastest,
as its guard keeps the load imbalance near a group-by-group least-loaded placement's while most groups find their
history (docs/results.md).

Registered through verl's extension point: ``actor_rollout_ref.rollout.router_config_path`` names a YAML whose
``router_class`` is this class (``configs/router/group_affinity.yaml``); verl builds it as a Ray actor with
``(servers, yaml_config)`` (``router.py`` ``_create_plugin_extension``).
"""
from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping, Sequence
from typing import Any

from verl.workers.rollout.router import DEFAULT_ROUTING_CACHE_SIZE, GlobalRequestLoadBalancer

DEFAULT_MAX_EXCESS = 64


def group_key(prompt_ids: Sequence[int] | None) -> str | None:
    """A GRPO group's key: a digest of its prompt's token ids (None without them)."""
    if prompt_ids is None:
        return None
    h = hashlib.blake2b(digest_size=16)
    for t in prompt_ids:
        h.update(int(t).to_bytes(8, "little", signed=True))
    return h.hexdigest()


GROUP_PROMPT = "#group-prompt="  # request-id suffix: the length of the group's prompt in the request's prompt_ids


def group_request_id(request_id: str, prompt_len: int) -> str:
    """``request_id`` marked with the length of its group's prompt, for a request whose prompt_ids extend that prompt
    (a resumed response's continuation, a routes re-prefill): the balancer then places it by its group. Idempotent;
    the id stays unique per trajectory (verl hands it to vLLM under ``full_determinism``)."""
    base, sep, _ = request_id.rpartition(GROUP_PROMPT)
    return f"{base if sep else request_id}{GROUP_PROMPT}{int(prompt_len)}"


def group_prompt(request_id: str, prompt_ids: Sequence[int] | None) -> Sequence[int] | None:
    """The group's prompt of a request: its prompt_ids, cut to the length its id carries (``group_request_id``)."""
    _, sep, n = request_id.rpartition(GROUP_PROMPT)
    return prompt_ids[: int(n)] if sep and n.isdigit() and prompt_ids is not None else prompt_ids


def rendezvous(key: str, ranks: Mapping[str, int]) -> str:
    """The server of ``ranks`` (server id -> its rank) whose digest of (``key``, rank) is highest: a group's home.
    Depends on the ranks only, not on the ids (addresses) or the order, so it survives a restart; removing a server
    moves only the keys it held (highest random weight hashing)."""
    if not ranks:
        raise RuntimeError("No available servers in load balancer")

    def score(server: str) -> bytes:
        return hashlib.blake2b(f"{key}/{ranks[server]}".encode(), digest_size=8).digest()

    return max(ranks, key=score)


def choose_server(loads: Mapping[str, int], group_server: str | None, max_excess: int | None,
                  rng: random.Random | None = None) -> str:
    """The routing decision: the group's replica while it is in the pool and holds at most ``max_excess`` in-flight
    requests more than the least-loaded one (None: no guard), else the least-loaded replica (ties at random, as
    verl's router breaks them)."""
    if not loads:
        raise RuntimeError("No available servers in load balancer")
    least = min(loads.values())
    if group_server in loads and (max_excess is None or loads[group_server] - least <= max_excess):
        return group_server
    return (rng or random).choice([s for s, c in loads.items() if c == least])


class GroupAffinityLoadBalancer(GlobalRequestLoadBalancer):
    """verl's sticky + least-loaded balancer, routing by group (see the module docstring). ``config`` is the router
    YAML as verl loads it: ``max_excess`` (an int >= 0, or null for no guard; default 64), ``max_cache_size``. A
    server's rank is its place in ``servers``; one added later takes the next rank (or its old one back)."""

    def __init__(self, servers: dict[str, Any], config: Mapping | None = None, **kwargs):
        config = dict(config or {})
        cache = int(config.get("max_cache_size", kwargs.pop("max_cache_size", DEFAULT_ROUTING_CACHE_SIZE)))
        super().__init__(servers=servers, max_cache_size=cache)
        self.max_excess = config.get("max_excess", DEFAULT_MAX_EXCESS)
        if self.max_excess is not None and (isinstance(self.max_excess, bool) or not isinstance(self.max_excess, int)
                                            or self.max_excess < 0):
            raise ValueError(f"router config max_excess={self.max_excess!r}: set an int >= 0 (in-flight requests a "
                             "group's replica may hold above the least-loaded one) or null for no load guard")
        self._rank: dict[str, int] = {sid: i for i, sid in enumerate(servers)}  # kept for servers that leave
        self._running: dict[str, list] = {}  # group -> [its replica now, its requests in flight]
        self._request_group: dict[str, str] = {}  # request id -> group, while in flight
        self.stats = {"home": 0, "followed": 0, "guarded": 0}

    def require_acquire_fields(self) -> list[str]:
        return ["prompt_ids"]

    def require_release_fields(self) -> list[str]:
        return ["request_id"]

    def add_servers(self, servers: dict[str, Any]) -> None:
        for sid in servers:
            self._rank.setdefault(sid, max(self._rank.values(), default=-1) + 1)
        super().add_servers(servers)

    def home_server(self, prompt_ids: Sequence[int]) -> str:
        """The home of the group of ``prompt_ids`` among the servers in the pool now."""
        return self._home(group_key(prompt_ids))

    def _home(self, key: str) -> str:
        return rendezvous(key, {sid: self._rank[sid] for sid in self._inflight_requests})

    def acquire_server(self, request_id: str, prompt_ids: Sequence[int] | None = None, **_):
        sticky = self._request_id_to_server.get(request_id)
        if sticky is not None and sticky in self._inflight_requests:  # a trajectory's later turns: verl's sticky
            self._inflight_requests[sticky] += 1
            return sticky, self._servers[sticky]
        key = group_key(group_prompt(request_id, prompt_ids))
        running = self._running.get(key) if key is not None else None
        home = self._home(key) if key is not None and self._inflight_requests else None
        target = running[0] if running else home
        server_id = choose_server(self._inflight_requests, target, self.max_excess)
        if key is not None:
            self.stats["guarded" if server_id != target else "home" if server_id == home else "followed"] += 1
            if running and running[0] == server_id:
                running[1] += 1
            else:  # the group's first request of this round, or the guard moved the rest of it
                self._running[key] = [server_id, (running[1] if running else 0) + 1]
            self._request_group[request_id] = key
        self._request_id_to_server[request_id] = server_id
        self._inflight_requests[server_id] += 1
        return server_id, self._servers[server_id]

    def release_server(self, server_id: str, request_id: str | None = None) -> None:
        super().release_server(server_id, request_id)
        key = self._request_group.pop(request_id, None)
        running = self._running.get(key) if key is not None else None
        if running is not None:
            running[1] -= 1
            if running[1] <= 0:
                del self._running[key]

    def get_status(self) -> dict:
        return {**super().get_status(), "group_affinity": dict(self.stats), "groups_running": len(self._running)}
