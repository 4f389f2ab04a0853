"""Test stand-ins around the in-process engine (:mod:`recipe.route_record.engine`) for the adapter's engine tests:
verl's ``CheckpointEngineManager`` and ``AgentLoopManagerTQ`` replaced by in-process equivalents (docs/testing.md,
"The test doubles that are left, and why")."""
from __future__ import annotations

from recipe.route_record.engine import ForcedLengths, InProcessVLLM


class EngineReplicas:
    """Test stand-in for verl's ``CheckpointEngineManager`` over the in-process engine: abort aborts the engine's
    requests; sleep, weight update and resume are recorded (there is no trainer to sync from)."""

    def __init__(self, engine: InProcessVLLM):
        self.engine, self.calls = engine, []

    def abort_replicas(self, reject_request=False):
        self.calls.append("abort")
        self.engine.run(self.engine.abort_all())

    def resume_generation_replicas(self):
        self.calls.append("resume")

    def sleep_replicas(self):
        self.calls.append("sleep")

    def update_weights(self, step=None):
        self.calls.append("update_weights")


class OneWorker:
    """Test stand-in for verl's ``AgentLoopManagerTQ``: each batch goes to one in-process ``AgentLoopWorkerTQ`` on
    the engine's event loop (the engine is bound to one loop) instead of spreading over Ray actors."""

    def __init__(self, engine: InProcessVLLM, worker):
        self.engine, self.worker = engine, worker

    def generate_sequences(self, batch):
        self.engine.run(self.worker.generate_sequences(batch))


def attach_engine(trainer, cfg, engine: InProcessVLLM, server_cls: type = ForcedLengths) -> ForcedLengths:
    """Route ``trainer``'s rollouts to ``engine``: a ``server_cls`` server (verl's server client, forced lengths) and
    verl's ``AgentLoopWorkerTQ`` running the recipe's agent loop behind ``OneWorker``. The worker is built on the
    engine's event loop: agent loops bind the loop they are created on."""
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

    rollout = cfg.actor_rollout_ref.rollout
    server = server_cls(engine, prompt_length=rollout.prompt_length, response_length=rollout.response_length,
                        global_steps=0)

    async def make_worker():
        return AgentLoopWorkerTQ.__ray_actor_class__(cfg, server)

    trainer.agent_loop_manager = OneWorker(engine, engine.run(make_worker()))
    return server
