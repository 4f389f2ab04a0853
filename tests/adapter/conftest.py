"""The recipe's composed config pointed at the tiny local artifacts."""
import pytest
from omegaconf import OmegaConf

from recipe.route_record.config import compose_recipe


@pytest.fixture
def recipe_config(tiny_artifacts, tmp_path):
    return compose_recipe(tiny_artifacts, [f"trainer.default_local_dir={tmp_path}/run"])


@pytest.fixture
def tq_cluster(tq_session):
    """The session's TransferQueue, emptied after each test: tests share one cluster and must not see each other's
    records (a left-over record changes what verl's replay buffer and the over-sample driver find)."""
    yield tq_session
    for partition, items in (tq_session.kv_list() or {}).items():
        if items:
            tq_session.kv_clear(keys=list(items), partition_id=partition)


@pytest.fixture(scope="session")
def tq_session():
    """A real TransferQueue in a local Ray cluster (one storage unit keeps startup short on 2 cores)."""
    import ray
    import transfer_queue as tq

    ray.init(num_cpus=16, include_dashboard=False, ignore_reinit_error=True)
    tq.init(OmegaConf.create({"enable": True, "metrics": {"enabled": False, "port": 0}, "backend": {
        "storage_backend": "SimpleStorage",
        "SimpleStorage": {"total_storage_size": 8192, "num_data_storage_units": 1}}}))
    yield tq
    tq.close()
    ray.shutdown()
