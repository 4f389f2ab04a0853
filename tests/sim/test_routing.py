"""The simulator's router (recipe/sim/routing.py) against the real GroupAffinityLoadBalancer (recipe/adapter/router.py)
on the same arrivals: homes, the per-request guard and its splits."""
import numpy as np
import pytest

from recipe.adapter.router import GroupAffinityLoadBalancer
from recipe.sim import routing as R

PROMPTS, N, BATCH, REPLICAS, EPOCHS = 2048, 16, 32, 4, 3  # the users' n, batch and replicas; 1/8 of their prompts


def run_both(seed: int = 0):
    """Epochs of shuffled steps through the real balancer (no Ray: the class itself, fake server handles) and the
    model, each step's requests in one arrival order (8 agent workers) for both."""
    rng = np.random.default_rng(seed)
    real = GroupAffinityLoadBalancer({f"10.0.0.{i}:8000": i for i in range(REPLICAS)}, {"max_excess": R.MAX_EXCESS})
    rank = {sid: i for i, sid in enumerate(real.get_all_servers())}
    prompt = {g: [151644, g, 7, g % 13] for g in range(PROMPTS)}
    real_home = np.array([rank[real.home_server(prompt[g])] for g in range(PROMPTS)])
    out = {k: [] for k in ("group", "real", "same_homes", "model", "real_home", "model_home")}
    for epoch in range(EPOCHS):
        order = rng.permutation(PROMPTS)
        for s in range(PROMPTS // BATCH):
            group = np.repeat(order[s * BATCH:(s + 1) * BATCH], N)[R.worker_arrivals(BATCH * N, R.AGENT_WORKERS, rng)]
            placed = []
            for i, g in enumerate(group.tolist()):
                placed.append(real.acquire_server(f"{epoch}-{s}-{i}", prompt_ids=prompt[g])[0])
            for i, sid in enumerate(placed):
                real.release_server(sid, request_id=f"{epoch}-{s}-{i}")
            model_home = R.homes(group, REPLICAS)
            out["group"].append(group + epoch * PROMPTS)
            out["real"].append([rank[p] for p in placed])
            out["real_home"].append(real_home[group])
            out["same_homes"].append(R.route_step(group, real_home[group], REPLICAS, R.MAX_EXCESS, rng))
            out["model"].append(R.route_step(group, model_home, REPLICAS, R.MAX_EXCESS, rng))
            out["model_home"].append(model_home)
    return {k: np.concatenate(v) for k, v in out.items()}


@pytest.fixture(scope="module")
def both():
    return run_both()


def test_the_model_places_as_the_real_balancer(both):
    """Fully-home and split shares within 2 points, with the real balancer's homes and with the model's own."""
    real = R.placement_shares(both["group"], both["real"], both["real_home"])
    same = R.placement_shares(both["group"], both["same_homes"], both["real_home"])
    model = R.placement_shares(both["group"], both["model"], both["model_home"])
    assert 0.05 < real["split"] < 0.2 and real["fully_home"] > 0.8, real  # the guard acts, and splits groups
    for sim in (same, model):
        for key in ("fully_home", "split"):
            assert abs(sim[key] - real[key]) <= 0.02, (key, real, sim)


def test_the_model_splits_groups_as_the_guard_does():
    """Per request: with no guard every group is home; a group past the guard moves to the least-loaded, and the
    rest follows it (not back home)."""
    rng = np.random.default_rng(0)
    group = np.repeat([0, 1, 2], 4)
    assert (R.route_step(group, np.zeros(12, int), 2, None, rng) == 0).all()
    where = R.route_step(group, np.zeros(12, int), 2, 2, rng)
    # group 0's 4th request finds home 3 above replica 1: it goes there; group 1's first goes home (3 - 1 <= 2), its
    # 2nd is guarded (4 - 1) and the rest follows it to replica 1 though home is back within the guard at (4, 3)
    assert where.tolist() == [0, 0, 0, 1, 0, 1, 1, 1, 0, 0, 0, 1]
    assert R.placement_shares(group, where, np.zeros(12, int)) == {"groups": 3, "fully_home": 0.0, "split": 1.0,
                                                                   "moved": 0.0}
    moved = R.placement_shares(group, [0] * 4 + [1] * 4 + [0, 1, 0, 0], np.zeros(12, int))
    assert moved == pytest.approx({"groups": 3, "fully_home": 1 / 3, "split": 1 / 3, "moved": 1 / 3})


def test_homes_are_stable_and_a_removed_replica_moves_only_its_rows():
    rows = np.arange(4000)
    h = R.homes(rows, 4)
    assert (R.homes(rows[::-1], 4)[::-1] == h).all()
    assert np.bincount(h, minlength=4).min() > 850
    without = R.homes(rows, [0, 1, 3])
    assert (without[h != 2] == h[h != 2]).all() and set(without[h == 2]) == {0, 1, 3}


def test_worker_arrivals_interleave_contiguous_chunks():
    order = R.worker_arrivals(64, 8, np.random.default_rng(1))
    assert sorted(order) == list(range(64)) and (order != np.arange(64)).any()
    for w in range(8):
        mine = order[(order >= 8 * w) & (order < 8 * w + 8)]
        assert mine.tolist() == list(range(8 * w, 8 * w + 8)), "a worker submits its chunk in order"
    with pytest.raises(ValueError, match="workers"):
        R.worker_arrivals(4, 0, np.random.default_rng(0))


def test_the_cli_prints_the_shares(capsys):
    import json

    assert R.main(["--prompts", "256", "--max-excess", "-1"]) == 0
    assert json.loads(capsys.readouterr().out) == {"groups": 256, "fully_home": 1.0, "split": 0.0, "moved": 0.0,
                                                   "history": 1.0}
    assert R.main(["--prompts", "256", "--max-excess", "8"]) == 0
    shares = json.loads(capsys.readouterr().out)
    assert shares["split"] > 0.1 and shares["history"] < 1
