"""The Transformer Engine stand-in is offered to Megatron-Bridge's imports only, and gone after its scope."""
import sys

import pytest

from recipe.megatron_check import te_stand_in

IMPORT_TE = "import transformer_engine.pytorch as te\nresult = te.Linear"


def _import_as(module_name: str):
    scope = {"__name__": module_name}
    exec(IMPORT_TE, scope)  # the finder looks at the importing frame's __name__
    return scope["result"]


@pytest.mark.skipif("transformer_engine" in sys.modules, reason="a real Transformer Engine is imported")
def test_only_megatron_bridge_gets_the_stand_in_and_nothing_is_left():
    with te_stand_in.scoped():
        with pytest.raises(ImportError):
            _import_as("megatron.core.transformer")
        linear = _import_as("megatron.bridge.peft.lora_layers")
        assert te_stand_in.is_stand_in(linear)
        with pytest.raises(RuntimeError, match="stand-in: transformer_engine.pytorch.Linear was called"):
            linear(16, 16)
    assert not [n for n in sys.modules if n.split(".")[0] == "transformer_engine"]
    with pytest.raises(ImportError):
        _import_as("megatron.bridge.peft.lora_layers")


def test_leaks_names_a_module_outside_megatron_bridge_that_holds_a_stand_in(monkeypatch):
    import types

    with te_stand_in.scoped():
        linear = _import_as("megatron.bridge.x")
    holder = types.ModuleType("megatron.core.holder")
    holder.Linear = linear
    monkeypatch.setitem(sys.modules, holder.__name__, holder)
    assert te_stand_in.leaks() == ["megatron.core.holder"]
    monkeypatch.delitem(sys.modules, holder.__name__)
    assert te_stand_in.leaks() == []
