"""A verl platform for hosts without an accelerator: device ``"cpu"``, gloo, shared-memory weight transfer.

verl 0.9.1 selects its platform through ``verl.plugin.platform.PlatformRegistry``; this module registers ``"cpu"``
when imported (``VERL_USE_EXTERNAL_MODULES=recipe.cpu.verl_platform``, which ``verl/__init__.py`` imports in every
process, Ray actors included) and ``VERL_PLATFORM=cpu`` picks it. Everything else of verl runs unchanged:

* Ray placement groups ask for the platform's resource; it stays ``"GPU"`` and the local Ray cluster gets as many
  fake GPUs as the run needs (``+ray_kwargs.ray_init.num_gpus=N``): scheduling tokens only, nothing touches CUDA.
  (verl's vLLM replica reads the worker's accelerator id from Ray, ``vllm_async_server.py:1348``.)
* ``current_device()`` is ``"cpu"``: verl passes it to ``tensor.to()``, where an int would mean ``cuda:N``.
* ``is_ipc_supported()`` is False, so verl's weight sync to vLLM uses shared memory instead of CUDA IPC.
* ``device_module`` stands in for ``torch.cuda`` (what verl calls through ``get_torch_device()``).
* One shim: ``verl/utils/distributed.py:89`` builds the backend ``"cpu:gloo,{device}:{backend}"``, which for
  device "cpu" is ``"cpu:gloo,cpu:gloo"`` and torch rejects (duplicate device type); the engine workers import
  ``initialize_global_process_group_ray`` by name, so it is rebound here, before they import it, to default to
  ``"cpu:gloo"``.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any, Optional

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

PLATFORM_NAME = "cpu"
KV_CACHE_GIB_DEFAULT = "1"  # vLLM CPU sizes its KV cache from VLLM_CPU_KVCACHE_SPACE (GiB); the tiny model needs little


def selected() -> bool:
    return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM_NAME


def _noop(*args, **kwargs) -> None:
    return None


def _zero(*args, **kwargs) -> int:
    return 0


def _mem_get_info(device=None) -> tuple[int, int]:
    import psutil

    vm = psutil.virtual_memory()
    return vm.available, vm.total


class CpuDeviceModule:
    """What verl calls on ``torch.cuda`` through ``get_torch_device()``, for the host.

    ``is_available()`` is False so verl's memory accounting helpers skip themselves; streams and events are
    ``torch.cpu``'s (no-ops); the RNG is torch's default generator. The attribute list is pinned against verl's
    source by a contract test.
    """

    __name__ = "recipe.cpu.verl_platform.CpuDeviceModule"
    is_available = staticmethod(lambda: False)
    current_device = staticmethod(lambda: PLATFORM_NAME)
    device_count = staticmethod(lambda: 1)
    get_device_name = staticmethod(lambda *a, **k: "cpu")
    set_device = synchronize = empty_cache = ipc_collect = staticmethod(_noop)
    reset_peak_memory_stats = reset_accumulated_memory_stats = set_per_process_memory_fraction = staticmethod(_noop)
    memory_allocated = memory_reserved = max_memory_allocated = max_memory_reserved = staticmethod(_zero)
    mem_get_info = staticmethod(_mem_get_info)
    manual_seed = manual_seed_all = staticmethod(torch.manual_seed)
    get_rng_state = staticmethod(torch.get_rng_state)
    set_rng_state = staticmethod(torch.set_rng_state)
    Stream = torch.cpu.Stream
    Event = torch.cpu.Event
    stream = staticmethod(torch.cpu.stream)
    current_stream = staticmethod(torch.cpu.current_stream)


@PlatformRegistry.register(platform=PLATFORM_NAME)
class PlatformCPU(PlatformBase):
    @property
    def device_name(self) -> str:
        return PLATFORM_NAME

    @property
    def vendor_name(self) -> str:
        return PLATFORM_NAME

    @property
    def device_module(self):
        return CpuDeviceModule

    def is_available(self) -> bool:
        return False

    def is_platform_available(self, use_smi_check=False) -> bool:
        return selected()

    def current_device(self):
        return PLATFORM_NAME

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: Optional[int] = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0):
        return (None, None)

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # verl's vLLM server writes the worker's accelerator id here: keep it off CUDA_VISIBLE_DEVICES.
        return "VERL_CPU_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def rollout_env_vars(self) -> dict[str, str]:
        return {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", KV_CACHE_GIB_DEFAULT)}

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def patch_process_group_init() -> None:
    """Default verl's global process group to plain gloo (see the module docstring); idempotent."""
    import verl.utils.distributed as distributed

    original = distributed.initialize_global_process_group_ray
    if getattr(original, "recipe_cpu_shim", False):
        return

    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        return original(timeout_second=timeout_second, backend=backend or "cpu:gloo")

    initialize_global_process_group_ray.recipe_cpu_shim = True
    distributed.initialize_global_process_group_ray = initialize_global_process_group_ray


if selected():
    patch_process_group_init()
