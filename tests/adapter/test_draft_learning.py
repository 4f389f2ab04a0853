"""recipe/adapter/draft_learning.py's order of work, with the engines and the head trainer stood in (the real ones:
tests/spec/test_head_capture.py, test_eagle3_head_sync.py, test_head_trainer.py; verl's loop: tests/e2e/test_resume.py).

The step's captures are harvested before the replicas sleep and trained on in a thread; the step joins it (its metrics
are the step's, its failure is raised), and the push after the weight sync carries the trained head and raises when
an engine's head differs from it."""
import threading
import types

import numpy as np
import pytest

from recipe.adapter import draft_learning


class Trainer:
    def __init__(self, fail=False):
        self.state_version, self.fail, self.trained_on, self.release = 0, fail, None, threading.Event()
        self.config = {}

    def train(self, records):
        self.release.wait(10)
        if self.fail:
            raise ValueError("nan loss")
        self.trained_on, self.state_version = records, self.state_version + 1
        return {"draft_head/optimizer_steps": 8.0}

    def state(self):
        return {"v": np.array([self.state_version], np.float32)}


def learning(monkeypatch, trainer, pushes, problems=()):
    settings = types.SimpleNamespace(online=True, capture_tokens=100)
    dl = draft_learning.DraftLearning.__new__(draft_learning.DraftLearning)
    dl.settings, dl.trainer, dl.last_metrics, dl._training, dl.push_s = settings, trainer, {}, None, float("nan")
    rec = lambda t: {"prompt": 1, "tokens": np.array(t), "hidden": np.zeros((len(t), 2), np.float16)}  # noqa: E731
    harvest = [[{"records": [rec([3, 2, 1]), rec([1, 2, 3])], "dropped": 2, "recaptured": 0}]]
    monkeypatch.setattr(draft_learning, "call_engines", lambda servers, method, *a: harvest)
    monkeypatch.setattr(draft_learning, "unpack", lambda w: w)
    monkeypatch.setattr(draft_learning, "replica_servers", lambda cm: ["replica"])
    import recipe.drafting.head_sync as head_sync

    monkeypatch.setattr(head_sync, "push_head",
                        lambda servers, state, config: pushes.append(int(state["v"][0])) or list(problems))
    return dl


def test_the_push_waits_for_the_steps_training_and_carries_its_head(monkeypatch):
    trainer, pushes = Trainer(), []
    dl = learning(monkeypatch, trainer, pushes)
    dl.after_rollout(None)
    assert dl._training.thread.is_alive()  # training beside the actor update
    trainer.release.set()
    dl.finish_training()
    assert dl.step_metrics()["draft_head/optimizer_steps"] == 8.0 and dl.last_metrics["draft_head/capture_dropped_tokens"] == 2
    assert [r["tokens"].tolist() for r in trainer.trained_on] == [[1, 2, 3], [3, 2, 1]]  # not the arrival order
    dl.push(None)
    assert pushes == [1]


def test_a_failed_training_or_a_differing_engine_stops_the_run(monkeypatch):
    trainer = Trainer(fail=True)
    trainer.release.set()
    dl = learning(monkeypatch, trainer, [])
    dl.after_rollout(None)
    with pytest.raises(RuntimeError, match="online training failed"):
        dl.push(None)
    dl = learning(monkeypatch, Trainer(), [], problems=["replica 0: dp 0 tp 0/1: model.fc.weight differs"])
    with pytest.raises(RuntimeError, match="model.fc.weight differs"):
        dl.push(None)
    monkeypatch.setattr(draft_learning, "replica_servers", lambda cm: [])
    with pytest.raises(RuntimeError, match="no rollout replica"):
        dl.push(None)
