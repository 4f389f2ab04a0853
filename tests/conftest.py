"""Session fixtures shared by all tests: tiny local artifacts, verl's composed config, one in-process vLLM engine.

``scripts/test.sh`` sources ``scripts/lib/cpu_env.sh``; the defaults below make a plain ``python -m pytest`` work too
(no hub access on these machines, and forked tokenizers would warn or deadlock).
"""
import os
import sys
from collections import Counter
from pathlib import Path

# the test harness (tests/support/harness): not a package of the product, and `tests` is not a package (verl installs one)
SUPPORT = str(Path(__file__).resolve().parent / "support")
if SUPPORT not in sys.path:
    sys.path.insert(0, SUPPORT)
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [SUPPORT, os.environ.get("PYTHONPATH")]))  # subprocesses too

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
# the Ray clusters the tests start (TransferQueue's) run their workers at the tests' priority, not Ray's niceness 15
# (recipe/cpu/preset.py PLATFORM_ENV: starved behind any other CPU load)
os.environ.setdefault("RAY_worker_niceness", "0")
# vLLM's CPU sampler is compiled by torch even in eager mode (compiled_random_sample), and each engine start first
# probes the CPU's vector ISAs by building and loading a library in four `python -c "import torch ..."` subprocesses
# (measured: 9.3 CPU-s of a ~120 CPU-s 2-step launch, and as much for each engine a test starts). Inductor still uses
# only the ISAs /proc/cpuinfo reports; without the probe, a compiler unable to build one fails the compile loudly
# instead of falling back to a narrower ISA.
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")

import pytest  # noqa: E402

# Tiny prompts are ~60 tokens: these lengths keep agent-loop tests fast while leaving room for long aborted requests.
PROMPT_LENGTH, RESPONSE_LENGTH, ENGINE_MAX_MODEL_LEN = 256, 64, 2048


TIERS = ("quick", "full")


def pytest_addoption(parser):
    parser.addoption("--tier", choices=TIERS, default="quick",
                     help="quick (the default, what a contributor runs before a commit): every test but the "
                          "end-to-end launches outside tests/e2e/conftest.py's QUICK_RUNS and, unless -m selects "
                          "them, the `network` tests (PyPI downloads); full: everything (.ci/run)")


def _is_e2e(item) -> bool:
    return "/tests/e2e/" in str(item.fspath)


def _uses_an_engine(item) -> bool:
    return item.get_closest_marker("engine") is not None or "vllm_engine" in getattr(item, "fixturenames", ())


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which names each test's group in its id
def pytest_collection_modifyitems(config, items):
    """Tests that use the engine are ``engine`` tests even if they forget the marker (``-m "not engine"`` works).

    In one process the end-to-end tests go last: their runs start in the background when collection ends
    (tests/e2e/conftest.py) and take longer than everything else, which runs beside them meanwhile. Under pytest-xdist
    (``scripts/test.sh`` runs three workers) they form one group that goes first, to one worker, which starts the
    runs at its first test; the tests that start vLLM engines form a second group, so one worker holds them (one
    engine's memory at a time, the session's engine shared) while the third runs everything else. The rest is
    grouped too, by module, and the tests on the session's TransferQueue as one: a module's (or the session's)
    fixture is then built by one worker, not by each worker that gets one of its tests (the Megatron check's two
    torchrun launches ran twice and each worker started its own Ray cluster: ~2 CPU-minutes)."""
    for item in items:
        if "vllm_engine" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.engine)
    if config.getoption("--tier") == "quick" and not config.option.markexpr:
        network = [item for item in items if item.get_closest_marker("network")]
        if network:
            config.hook.pytest_deselected(items=network)
            items[:] = [item for item in items if not item.get_closest_marker("network")]
    if not hasattr(config, "workerinput"):
        items.sort(key=_is_e2e)
        return
    from _pytest.nodeid import coerce_node_id

    groups = {}
    for item in items:
        group = groups[item] = "e2e" if _is_e2e(item) else "engine" if _uses_an_engine(item) else _rest_group(item)
        item.add_marker(pytest.mark.xdist_group(group))
        # pytest-xdist 3.8 names the group in the id through ``_nodeid``, which pytest 9 no longer reads (the id
        # is ``_id``): without this every test is its own unit and each worker would start the e2e runs
        item._id = coerce_node_id(f"{item.nodeid}@{group}")
    # xdist hands out groups in this order (scripts/test.sh passes --no-loadscope-reorder: its own order, the
    # largest group first, sent the e2e group behind a dozen larger modules, and its launches started 8 min late).
    # The tests on the trained tiny model go first in their worker: in a fresh clone that model's build (one thread,
    # ~8 CPU-minutes) is the critical path, as the multi-turn launches wait for it; a worker waiting for it leaves
    # the build the CPU. Sent last, the other tests ran beside the build, it took 22 min, and the suite then waited.
    size = Counter(groups.values())
    trained = {groups[item] for item in items if _uses_the_trained_model(item)}
    items.sort(key=lambda item: ({"e2e": 0, "engine": 1}.get(groups[item], 2),
                                 not (_uses_the_trained_model(item) if groups[item] == "engine"
                                      else groups[item] in trained),
                                 -size[groups[item]]))


def _uses_the_trained_model(item) -> bool:
    return item.get_closest_marker("trained_model") is not None


def _rest_group(item) -> str:
    """``tq`` for the tests on the session's TransferQueue (one Ray cluster), else the module (``core/test_x``)."""
    if "tq_cluster" in getattr(item, "fixturenames", ()):
        return "tq"
    path = Path(str(item.fspath)).resolve()
    return path.relative_to(Path(__file__).resolve().parent).with_suffix("").as_posix()


@pytest.fixture(scope="session")
def tiny_artifacts():
    """Tiny Qwen3-MoE model dir (with tokenizer) and train/test parquet, built once per machine and cached."""
    from recipe.tiny.artifacts import tiny_artifacts as build

    return build()


@pytest.fixture(scope="session")
def verl_config(tiny_artifacts):
    """verl's own ``ppo_megatron_trainer`` config composed with Hydra and pointed at the tiny artifacts.

    Composed rather than hand-written so tests follow verl's real defaults. Shared by the session: treat it as
    read-only (``copy.deepcopy`` before changing it).
    """
    import verl
    from hydra import compose, initialize_config_dir

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose("ppo_megatron_trainer", overrides=[
            f"actor_rollout_ref.model.path={tiny_artifacts.model_dir}",
            f"data.train_files={tiny_artifacts.train_parquet}",
            f"data.val_files={tiny_artifacts.test_parquet}",
            f"data.max_prompt_length={PROMPT_LENGTH}",
            f"data.max_response_length={RESPONSE_LENGTH}",
            "data.filter_overlong_prompts=True",
            "actor_rollout_ref.rollout.name=vllm",
            f"actor_rollout_ref.rollout.max_model_len={ENGINE_MAX_MODEL_LEN}",
        ])


@pytest.fixture(scope="session")
def vllm_engine(tiny_artifacts):
    """One in-process vLLM CPU engine on the tiny model per session (startup ~25-60 s); shut down at the end.
    32 sequences at a time: a step of more requests is capacity-bound (they queue)."""
    from recipe.route_record.engine import InProcessVLLM

    # priority scheduling: with equal priorities it is vLLM's FCFS (ties go by arrival), and the priority test can
    # order requests on the same engine
    # routed-expert capture on: the routing-replay tests read it (a server returns it only with routing_replay)
    engine = InProcessVLLM(tiny_artifacts.model_dir, max_model_len=ENGINE_MAX_MODEL_LEN, max_num_seqs=32, seed=0,
                           scheduling_policy="priority", enable_return_routed_experts=True)
    engine.run(engine.generate_forced([[0, 1]], [8]))  # the first request pays a one-off warmup (3-20 s)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
def eagle3_engine(tiny_artifacts):
    """One ``ROLLOUT_SPECULATIVE=eagle3`` engine per session: the tiny model drafting with its tiny trained EAGLE-3
    head (``recipe/tiny/eagle3_head.py``, ~2 min once per machine, cached), K = 3 draft tokens, through the
    ``speculative_config`` the recipe composes. Tests that change its head or wrap its drafter put it back."""
    from recipe.rollout_spec import speculative_config
    from recipe.route_record.engine import InProcessVLLM
    from recipe.tiny.eagle3_head import build_tiny_eagle3_head

    head = build_tiny_eagle3_head(tiny_artifacts.model_dir)
    spec = speculative_config({"ROLLOUT_SPECULATIVE": "eagle3", "ROLLOUT_SPECULATIVE_TOKENS": 3,
                               "ROLLOUT_SPECULATIVE_MAX_BATCH": 0, "ROLLOUT_MAX_NUM_SEQS": 32,
                               "DRAFT_MODEL_PATH": str(head)})
    assert spec == {"method": "eagle3", "num_speculative_tokens": 3, "model": str(head)}
    engine = InProcessVLLM(tiny_artifacts.model_dir, max_model_len=1024, max_num_seqs=32, seed=0,
                           disable_log_stats=False, logprobs_mode="processed_logprobs", kv_cache_gib=0.25,
                           speculative_config=spec)
    engine.head_dir = head
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
def route_records(vllm_engine, tiny_artifacts, tmp_path_factory):
    """The single-turn routing-replay paths, recorded once on the session's engine for the engine and the Megatron
    tests (``recipe.route_record.paths.record_single_turn``)."""
    from recipe.route_record.paths import record_single_turn

    return record_single_turn(vllm_engine, tiny_artifacts, tmp_path_factory.mktemp("routes"))


@pytest.fixture(scope="session")
def tool_route_records(tmp_path_factory):
    """The multi-turn routing-replay paths, recorded once for the engine and the Megatron tests
    (``recipe.route_record.paths.record_tool_turns``): ``(model_dir, records)``."""
    from recipe.route_record.paths import record_tool_turns

    return record_tool_turns(tmp_path_factory.mktemp("tool-routes"))
