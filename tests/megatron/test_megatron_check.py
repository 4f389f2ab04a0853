"""The Megatron path on the CPU: Megatron-Core 0.18 + Megatron-Bridge 0.5.1 (local layer spec) on the tiny Qwen3-MoE,
through ``python -m recipe.megatron_check`` as the lent GPU runs it (``--cpu``: gloo, fp32).

One ``reshard-save`` under torchrun (2 gloo ranks: TP 2, then EP 2) and one ``run`` that loads those checkpoints, in
subprocesses (Megatron's process groups are global to a process); the tests read the rows they wrote. What this
cannot prove is in docs/testing.md (TE checkpoints, resharding at the real sizes, the vLLM weight sync).
"""
import json
import sys

import pytest

from recipe.gpu_check import KL_MEAN_MAX
from harness.megatron_site import run_with_megatron

pytestmark = [pytest.mark.megatron, pytest.mark.slow]


@pytest.fixture(scope="module")
def rows(tmp_path_factory, tiny_artifacts):
    work = tmp_path_factory.mktemp("megatron")
    model = str(tiny_artifacts.model_dir)
    run_with_megatron([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m",
          "recipe.megatron_check", "reshard-save", "--cpu", "--work", str(work / "resharded"), "--model", model],
         work / "reshard-save.log")
    run_with_megatron([sys.executable, "-m", "recipe.megatron_check", "run", "--cpu", "--work", str(work / "run"), "--model", model,
          "--resharded", str(work / "resharded"), "--json", str(work / "rows.json")], work / "run.log")
    return {r["step"]: r for r in json.loads((work / "rows.json").read_text())}


def test_every_step_ran_and_passed(rows):
    assert list(rows) == ["environment", "bridge-logits", "bridge-unnormalised-routing-detected", "convert-mapping",
                          "distcp-save-load", "reshard-tp1-ep2-to-tp1-ep1", "reshard-tp2-ep1-to-tp1-ep1", "train",
                          "resume-checkpoint-manager"]
    assert [s for s, r in rows.items() if not r["ok"]] == []


def test_the_gpu_stack_versions_with_only_te_stood_in(rows):
    data = rows["environment"]["data"]
    assert (data["megatron-core"], data["megatron-bridge"], data["verl"]) == ("0.18.0", "0.5.1", "0.9.1")
    assert data["stand-ins"] == "transformer_engine"  # ray, pulp and datasets are the real ones here


def test_bridge_matches_hf_and_catches_unnormalised_routing(rows):
    assert rows["bridge-logits"]["data"]["kl_mean"] <= KL_MEAN_MAX / 100  # fp32: measured 2e-8
    assert rows["bridge-logits"]["data"]["top1_agreement"] == 1.0
    # the fixture's own weights with norm_topk_prob=false: Megatron-Bridge renormalises anyway, HF does not
    assert rows["bridge-unnormalised-routing-detected"]["data"]["kl_mean"] > KL_MEAN_MAX


def test_verl_converter_mapping_equals_the_bridge_tensor_for_tensor(rows):
    data = rows["convert-mapping"]["data"]
    assert data["copied"] == data["hf_parameters"] > 1_000_000
    assert data["differ"] == []


def test_dist_checkpoint_loads_back_bitwise_and_passes_the_preflight(rows):
    data = rows["distcp-save-load"]["data"]
    assert data["max_dlogit_before"] > 0.1 and data["max_dlogit_after"] == 0.0 and data["differ"] == []
    assert data["problem"] is None and "metadata.json" in data["broken_problem"]
    assert "metadata.json" in data["files"]


@pytest.mark.parametrize("saved_at", ["tp2-ep1", "tp1-ep2"])
def test_checkpoint_saved_at_two_ranks_loads_at_one(rows, saved_at):
    data = rows[f"reshard-{saved_at}-to-tp1-ep1"]["data"]
    assert data["differ"] == [] and data["max_dlogit_after"] == 0.0 and data["max_dlogit_before"] > 0.1


def test_training_steps_and_checkpoint_manager_round_trip(rows):
    losses = rows["train"]["data"]["losses"]
    assert len(losses) == 3 and losses[0] > losses[1] > losses[2]
    data = rows["resume-checkpoint-manager"]["data"]
    assert data["differ"] == [] and data["differ_before_load"] > 0 and "model" in "".join(data["saved"])
