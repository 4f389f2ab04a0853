"""Group affinity routing (``ROLLOUT_GROUP_AFFINITY=1``): every response of a GRPO group on one vLLM replica.

verl 0.9.1's router (``verl/workers/rollout/router.py`` ``GlobalRequestLoadBalancer``) sends each request to the
least-loaded replica (sticky only per ``request_id``, i.e. per trajectory), so a group's n responses scatter over the
replicas. Suffix drafting (``ROLLOUT_SPECULATIVE=suffix``) feeds running siblings into each other's drafts only on one
engine, so the recipe routes by group: the group's first request goes to the least-loaded replica, its siblings
follow it. A group is its prompt: siblings share ``prompt_ids`` (verl's ``LLMServerClient.generate`` hands them to the
router when it asks for them, ``require_acquire_fields``). A load guard sends a sibling elsewhere when the group's
replica holds more than ``max_excess`` in-flight requests above the least-loaded one.

Registered through verl's extension point: ``actor_rollout_ref.rollout.router_config_path`` names a YAML whose
``router_class`` is this class (``configs/router/group_affinity.yaml``); verl builds it as a Ray actor with
``(servers, yaml_config)`` (``router.py`` ``_create_plugin_extension``). Its cost in load balance is measured by
``bench/group_affinity.py`` (docs/results.md): off by default.
"""
from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping, Sequence
from typing import Any

from cachetools import LRUCache
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
    YAML as verl loads it: ``max_excess`` (int, or null for no guard; default 64), ``max_cache_size``."""

    def __init__(self, servers: dict[str, Any], config: Mapping | None = None, **kwargs):
        config = dict(config or {})
        cache = int(config.get("max_cache_size", kwargs.pop("max_cache_size", DEFAULT_ROUTING_CACHE_SIZE)))
        super().__init__(servers=servers, max_cache_size=cache)
        self.max_excess = config.get("max_excess", DEFAULT_MAX_EXCESS)
        self._group_server: LRUCache = LRUCache(maxsize=cache)
        self.stats = {"followed": 0, "placed": 0, "guarded": 0}

    def require_acquire_fields(self) -> list[str]:
        return ["prompt_ids"]

    def acquire_server(self, request_id: str, prompt_ids: Sequence[int] | None = None, **_):
        sticky = self._request_id_to_server.get(request_id)
        if sticky is not None and sticky in self._inflight_requests:  # a trajectory's later turns: verl's sticky
            self._inflight_requests[sticky] += 1
            return sticky, self._servers[sticky]
        key = group_key(prompt_ids)
        group_server = self._group_server.get(key) if key is not None else None
        server_id = choose_server(self._inflight_requests, group_server, self.max_excess)
        if group_server is None:
            self.stats["placed"] += 1
        elif server_id == group_server:
            self.stats["followed"] += 1
        else:
            self.stats["guarded"] += 1
        if key is not None:
            self._group_server[key] = server_id
        self._request_id_to_server[request_id] = server_id
        self._inflight_requests[server_id] += 1
        return server_id, self._servers[server_id]

    def clear_sticky_cache(self) -> dict:
        out = super().clear_sticky_cache()
        self._group_server.clear()
        return out

    def get_status(self) -> dict:
        return {**super().get_status(), "group_affinity": dict(self.stats), "groups": len(self._group_server)}
