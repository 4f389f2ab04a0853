"""``DISTCP_PATH=none``: no dist checkpoint; verl's Megatron engine loads the Hugging Face weights of MODEL_PATH.

The dist checkpoint stays the default (faster starts); ``none`` is the fallback that verl's own engine supports when
``use_dist_checkpointing`` is False: ``MegatronEngine._build_megatron_module`` then calls Megatron-Bridge's
``load_hf_weights(module, model_config.local_path)`` (``verl/workers/engine/megatron/transformer_impl.py:499-512``
in verl 0.9.1), for actor and ref alike (both are that engine).
"""
import importlib.util
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from recipe.preflight import run_preflight

ARR = "actor_rollout_ref"


def verl_source(relative: str) -> str:
    """A verl source file, read without importing it (the Megatron engine's import takes seconds)."""
    return (Path(importlib.util.find_spec("verl").origin).parent / relative).read_text()


def test_verls_megatron_engine_loads_hf_weights_through_the_bridge_without_a_dist_checkpoint():
    source = verl_source("workers/engine/megatron/transformer_impl.py")
    build = source[source.index("    def _build_megatron_module(self):"):source.index("    def _maybe_enable_fused")]
    branch = build[build.index("if self.engine_config.use_dist_checkpointing:"):]
    dist, hf = branch.split("        else:\n", 1)
    assert "load_mcore_dist_weights(" in dist and "dist_checkpointing_path" in dist
    assert "self.bridge.load_hf_weights(" in hf and "self.model_config.local_path" in hf


@pytest.mark.parametrize("value", ["none", "NONE"])
def test_distcp_none_composes_without_dist_checkpointing_for_actor_and_ref(env_30b, value):
    report = run_preflight([], {**env_30b, "DISTCP_PATH": value})
    assert report.ok, report.errors
    c = OmegaConf.to_container(report.config, resolve=True)
    for role in ("actor", "ref"):
        megatron = c[ARR][role]["megatron"]
        assert megatron["use_dist_checkpointing"] is False, role
        assert megatron["dist_checkpointing_path"] is None, role
    assert not [o for o in report.overrides if "dist_checkpointing_path" in o]
    assert any(n.startswith("DISTCP_PATH=none: no dist checkpoint; Megatron-Bridge loads the Hugging Face weights of "
                            "MODEL_PATH for actor and ref") for n in report.notes), report.notes
    assert dict(report.table)["dist checkpoint"] == "none: Megatron-Bridge loads MODEL_PATH"


def test_a_dist_checkpoint_path_is_still_the_default_and_set_for_both_roles(env_30b):
    c = OmegaConf.to_container(run_preflight([], env_30b).config, resolve=True)
    for role in ("actor", "ref"):
        assert c[ARR][role]["megatron"]["use_dist_checkpointing"] is True
        assert c[ARR][role]["megatron"]["dist_checkpointing_path"] == env_30b["DISTCP_PATH"]
