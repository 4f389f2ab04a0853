"""verl 0.9.1's router extension point, as recipe/adapter/router.py (ROLLOUT_GROUP_AFFINITY=1) uses it, pinned."""
from recipe.adapter.contract import check_params, check_source

ROUTER = "verl.workers.rollout.router"
RECHECK = "recipe/adapter/router.py GroupAffinityLoadBalancer and configs/router/group_affinity.yaml"


def test_plugin_router_from_the_rollout_config():
    check_source("verl.workers.rollout.llm_server:LLMServerManager._init_global_load_balancer",
                 ['router_config_path=getattr(self.rollout_config, "router_config_path", None)'], RECHECK)
    check_params(f"{ROUTER}:get_router_handle",
                 ["servers", "router_config_path", "full_determinism", "load_balancer_cls"], RECHECK)
    check_source(f"{ROUTER}:_create_plugin_extension",
                 ['router_class = yaml_config.get("router_class", None)', "ray_cls.remote(servers, yaml_config)"],
                 RECHECK + ": built with (servers, the YAML as a dict)")
    from verl.workers.config.rollout import RolloutConfig

    assert "router_config_path" in RolloutConfig.__dataclass_fields__, RECHECK


def test_balancer_interface_and_state():
    base = f"{ROUTER}:GlobalRequestLoadBalancer"
    check_params(f"{base}.__init__", ["self", "servers", "max_cache_size", "full_determinism"], RECHECK)
    check_params(f"{base}.acquire_server", ["self", "request_id"], RECHECK)
    check_params(f"{base}.release_server", ["self", "server_id", "request_id"], RECHECK)
    check_source(f"{base}.__init__", ["self._inflight_requests: dict[str, int]", "self._request_id_to_server: LRUCache",
                                      "self._servers: dict[str, ray.actor.ActorHandle]"], RECHECK + ": the state read")
    check_source(f"{base}.release_server", ["self._inflight_requests[server_id] -= 1"], RECHECK)
    # the client sends the fields the router asks for; generate() passes prompt_ids (the group key)
    check_source("verl.workers.rollout.llm_server:LLMServerClient._acquire_server",
                 ["self._load_balancer.require_acquire_fields.remote()",
                  "fields = {name: extra[name] for name in self._lb_require_acquire_fields if name in extra}"], RECHECK)
    check_source("verl.workers.rollout.llm_server:LLMServerClient.generate", ["prompt_ids=prompt_ids,"], RECHECK)


def test_the_pool_comes_in_replica_rank_order():
    """The router's homes hash the servers' ranks, their places in the pool verl builds it with: the pool must follow
    the replicas' ranks, not their addresses, for a restart to find the same homes."""
    manager = "verl.workers.rollout.llm_server:LLMServerManager"
    check_source(f"{manager}._initialize_llm_servers",
                 ["replica_rank=start_rank + replica_rank,", "for replica_rank in range(num_replicas)",
                  "self.server_addresses = [server._server_address for server in self.rollout_replicas]"],
                 RECHECK + ": GroupAffinityLoadBalancer's ranks")
    check_source(f"{manager}._init_global_load_balancer",
                 ["servers=dict(zip(self.server_addresses, self.server_handles, strict=True)),"],
                 RECHECK + ": GroupAffinityLoadBalancer's ranks")
