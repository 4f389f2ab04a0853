"""Group affinity routing (recipe/adapter/router.py): a GRPO group's responses on one replica, chosen least-loaded,
with the load guard; loaded through verl's router extension point from configs/router/group_affinity.yaml."""
import random

import numpy as np
import pytest

from recipe.adapter.router import GroupAffinityLoadBalancer, choose_server, group_key
from recipe.preflight.overrides import GROUP_AFFINITY_ROUTER
from harness.cpu_runs import CPU_RANDOM


def test_choose_server():
    loads = {"a": 3, "b": 1, "c": 1}
    assert choose_server(loads, "a", max_excess=2) == "a"  # within the guard: the group's replica
    assert choose_server(loads, "a", max_excess=1) in {"b", "c"}  # guard: the least-loaded instead
    assert choose_server(loads, "a", max_excess=None) == "a"
    assert choose_server(loads, "gone", max_excess=None) in {"b", "c"}  # a removed replica
    assert choose_server(loads, None, max_excess=0) in {"b", "c"}
    picks = {choose_server({"a": 0, "b": 0}, None, 0, rng=random.Random(s)) for s in range(20)}
    assert picks == {"a", "b"}, "ties at random, as verl's router"
    with pytest.raises(RuntimeError):
        choose_server({}, None, None)


def lb(n_servers=4, **config):
    return GroupAffinityLoadBalancer({f"s{i}": f"handle{i}" for i in range(n_servers)}, config)


def test_groups_stay_together_at_home():
    balancer = lb()
    assert balancer.require_acquire_fields() == ["prompt_ids"]
    prompts = [[g, 7, 8, g * 3] for g in range(8)]
    placed = {}
    for g, prompt in enumerate(prompts):  # 8 groups x 4 responses, all in flight (a synchronous step)
        servers = {balancer.acquire_server(f"{g}_{i}", prompt_ids=prompt)[0] for i in range(4)}
        assert servers == {balancer.home_server(prompt)}, servers
        placed[g] = servers.pop()
    assert balancer.get_status()["group_affinity"] == {"home": 32, "followed": 0, "guarded": 0}
    # the same trajectory again (a later turn): verl's sticky routing
    assert balancer.acquire_server("0_1", prompt_ids=prompts[0]+[5])[0] == placed[0]
    for g in range(8):
        for i in range(4):
            balancer.release_server(placed[g], request_id=f"{g}_{i}")
    assert balancer.clear_sticky_cache()["cleared_entries"] == 32
    assert balancer.get_status()["groups_running"] == 0


def ranks_of_homes(balancer, prompts, order) -> dict:
    """Where each prompt's group goes, as the server's rank, acquiring the prompts in ``order`` (no guard)."""
    rank = {sid: i for i, sid in enumerate(balancer.get_all_servers())}
    return {g: rank[balancer.acquire_server(f"r{g}", prompt_ids=prompts[g])[0]] for g in order}


def test_homes_survive_a_restart():
    """A restart builds a new balancer, its replicas on new addresses, and the requests arrive in another order: every
    prompt's group goes to the replica of the same rank (its history's engine), and homes spread over the replicas."""
    prompts = [[g, 11, g % 7] for g in range(400)]
    before = GroupAffinityLoadBalancer({f"10.0.0.{i}:4{i}00": i for i in range(4)}, {"max_excess": None})
    after = GroupAffinityLoadBalancer({f"10.0.1.{i}:5{i}11": i for i in range(4)}, {"max_excess": None})
    homes = ranks_of_homes(before, prompts, range(400))
    assert ranks_of_homes(after, prompts, reversed(range(400))) == homes
    shares = np.bincount(list(homes.values()), minlength=4) / 400
    assert shares.min() > 0.17 and shares.max() < 0.33, shares


def test_a_replica_that_leaves_the_pool_rehomes_only_its_prompts():
    """Its prompts go to one other replica each, the same epoch after epoch (their history builds up there again);
    the other prompts keep their homes; back in the pool under its address, it gets its prompts back."""
    prompts = [[g, 5, g * 2] for g in range(400)]
    balancer = lb(max_excess=None)

    def epoch(e: int) -> dict:
        where = {}
        for g, prompt in enumerate(prompts):
            where[g] = balancer.acquire_server(f"e{e}_{g}", prompt_ids=prompt)[0]
        for g, server in where.items():
            balancer.release_server(server, request_id=f"e{e}_{g}")
        return where

    first = epoch(0)
    gone = [g for g, s in first.items() if s == "s2"]
    assert 60 < len(gone) < 140
    balancer.remove_servers(["s2"])
    later = [epoch(e) for e in (1, 2, 3)]
    assert later[0] == later[1] == later[2], "a re-homed prompt must go to the same replica every epoch"
    assert all(later[0][g] == s for g, s in first.items() if s != "s2"), "only the removed replica's prompts move"
    assert {later[0][g] for g in gone} == {"s0", "s1", "s3"}
    balancer.add_servers({"s2": "handle2"})
    assert epoch(4) == first


def test_load_guard_breaks_affinity():
    balancer = lb(n_servers=2, max_excess=2)
    first = balancer.acquire_server("g_0", prompt_ids=[1, 2])[0]
    got = [balancer.acquire_server(f"g_{i}", prompt_ids=[1, 2])[0] for i in range(1, 6)]
    # the group's replica may run 2 above the other: then siblings spill over, and the group follows the spill
    assert got[:2] == [first, first] and got[2] != first
    assert balancer.get_status()["group_affinity"]["guarded"] >= 1


def test_a_prompts_next_group_goes_home_where_its_history_is():
    """A group's later epochs return to the replica of its first group (its drafting history), even when another
    replica is less loaded, within the guard; the guard moves a group without moving its home."""
    balancer = lb(n_servers=2, max_excess=4)
    home = balancer.acquire_server("e0_0", prompt_ids=[1, 2])[0]
    other = next(s for s in balancer.get_all_servers() if s != home)
    balancer.release_server(home, request_id="e0_0")
    balancer._inflight_requests[home] += 2  # other groups' requests: home is no longer the least-loaded
    assert balancer.acquire_server("e1_0", prompt_ids=[1, 2])[0] == home  # home, though not the least-loaded
    assert balancer.get_status()["group_affinity"]["home"] == 2  # e0_0 and e1_0
    balancer.release_server(home, request_id="e1_0")
    balancer._inflight_requests[home] += 8  # past the guard
    assert balancer.acquire_server("e2_0", prompt_ids=[1, 2])[0] == other  # guarded: the least-loaded
    assert balancer.acquire_server("e2_1", prompt_ids=[1, 2])[0] == other  # the rest of the group follows it
    balancer.release_server(other, request_id="e2_0")
    balancer.release_server(other, request_id="e2_1")
    balancer._inflight_requests[home] -= 8
    assert balancer.acquire_server("e3_0", prompt_ids=[1, 2])[0] == home  # home did not move


def test_group_key_is_the_prompt():
    assert group_key([1, 2, 3]) == group_key((1, 2, 3)) != group_key([1, 2, 4])
    assert group_key(None) is None


def test_verl_loads_the_class_from_the_recipe_yaml():
    from verl.workers.rollout.router import _load_router_yaml, _resolve_router_class

    config = _load_router_yaml(str(GROUP_AFFINITY_ROUTER))
    cls = _resolve_router_class(config["router_class"])
    assert cls is GroupAffinityLoadBalancer
    balancer = cls({"s0": "h0", "s1": "h1"}, config)  # how verl builds it (as a Ray actor)
    assert balancer.max_excess == 64
    for bad in (-1, "64", 1.5, True):
        with pytest.raises(ValueError, match="max_excess"):
            cls({"s0": "h0"}, {**config, "max_excess": bad})


def test_the_knob_sets_verls_router_config_path():
    """On the random CPU model: the knob does not depend on the model, and the trained one may still be building."""
    from recipe.preflight import run_preflight

    key = "actor_rollout_ref.rollout.router_config_path="
    on = run_preflight(env={**CPU_RANDOM, "ROLLOUT_GROUP_AFFINITY": "1"})
    assert on.ok, on.errors
    assert [o for o in on.overrides if o.startswith(key)] == [f"{key}'{GROUP_AFFINITY_ROUTER}'"]
    off = run_preflight(env=CPU_RANDOM)
    assert off.ok and not [o for o in off.overrides if o.startswith(key)], "off by default"


def test_a_request_naming_its_group_prompt_follows_its_group():
    """A resumed sibling's continuation or a routes re-prefill sends the prompt then stored tokens: its id names the
    prompt's length, so it is placed with its group, not as a group of its own."""
    from recipe.adapter.router import group_prompt, group_request_id

    balancer = lb()
    prompt = [3, 1, 4]
    home = balancer.acquire_server("g_0", prompt_ids=prompt)[0]
    for i, stored in enumerate(([9], [9, 2], [5, 5, 5])):
        rid = group_request_id(f"g_{i + 1}", len(prompt))
        assert group_prompt(rid, prompt + stored) == prompt
        assert balancer.acquire_server(rid, prompt_ids=prompt + stored)[0] == home
    assert balancer.get_status()["group_affinity"] == {"home": 4, "followed": 0, "guarded": 0}
    assert balancer.get_status()["groups_running"] == 1
    balancer.acquire_server("unmarked", prompt_ids=prompt + [9])  # the whole prompt_ids: another group
    assert balancer.get_status()["groups_running"] == 2
    assert group_request_id(group_request_id("r", 3), 3) == group_request_id("r", 3)  # marked once
    assert group_prompt("plain-id", prompt + [9]) == prompt + [9]


def test_verl_hands_the_router_the_request_id_at_release():
    """The balancer tracks a group's running requests through ``release_server(request_id=...)``: verl 0.9.1's
    client passes the fields the router's ``require_release_fields`` asks for."""
    from recipe.adapter.contract import check_source

    check_source("verl.workers.rollout.llm_server:LLMServerClient._release_server",
                 ["fields = {name: pool[name] for name in self._lb_require_release_fields if name in pool}"],
                 "recipe/adapter/router.py require_release_fields / release_server")
    assert lb().require_release_fields() == ["request_id"]
