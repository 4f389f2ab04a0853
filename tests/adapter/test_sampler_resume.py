"""LengthAwareEpochSampler inside torchdata's real StatefulDataLoader, as verl 0.9.1 builds it."""
import io

import numpy as np
import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from recipe.adapter.sampler import LengthAwareEpochSampler

N, B = 48, 4


class Rows(torch.utils.data.Dataset):
    def __len__(self):
        return N

    def __getitem__(self, i):
        return i


def true_length(rows):
    return (np.asarray(rows) * 37 % 1000 + 50).astype(float)


def make_loader(sampler):
    # Same arguments as PPOTrainer._init_dataloader (drop_last, no workers) with the recipe's sampler.
    return StatefulDataLoader(Rows(), batch_size=B, num_workers=0, drop_last=True, sampler=sampler,
                              collate_fn=lambda xs: list(xs))


def make_sampler(**kw):
    return LengthAwareEpochSampler(Rows(), batch_size=B, bucket_size=64, seed=11, **kw)


def run_steps(loader, sampler, it, k):
    """Consume k batches the way verl does (re-iterating at epoch end) and feed back lengths like step()."""
    out = []
    for _ in range(k):
        try:
            batch = next(it)
        except StopIteration:
            it = iter(loader)
            batch = next(it)
        rows = np.repeat(batch, 2)
        sampler.update(rows, true_length(rows))
        out.append(list(batch))
    return out, it


def roundtrip(state):
    buf = io.BytesIO()
    torch.save(state, buf)  # verl writes data.pt with torch.save and reads it with torch.load(weights_only=False)
    buf.seek(0)
    return torch.load(buf, weights_only=True)  # tensors only: also loadable in the safe mode


@pytest.mark.parametrize("k", [3, 12, 17, 30])  # mid epoch 1, end of epoch 1, mid epoch 2, mid epoch 3
def test_resume_reproduces_remaining_order_and_estimates(k):
    sampler = make_sampler()
    loader = make_loader(sampler)
    it = iter(loader)
    _, it = run_steps(loader, sampler, it, k)
    state = roundtrip(loader.state_dict())
    expected, _ = run_steps(loader, sampler, it, 30)

    sampler2 = make_sampler()
    loader2 = make_loader(sampler2)
    loader2.load_state_dict(state)
    # estimates restored exactly (checked before the continuation changes them)
    got, _ = run_steps(loader2, sampler2, iter(loader2), 30)
    assert got == expected
    assert np.array_equal(sampler2.estimates.value, sampler.estimates.value, equal_nan=True)
    assert sampler2.plan.epoch == sampler.plan.epoch


def test_restored_estimates_equal_saved_ones():
    sampler = make_sampler()
    loader = make_loader(sampler)
    run_steps(loader, sampler, iter(loader), 14)
    state = roundtrip(loader.state_dict())
    sampler2 = make_sampler()
    loader2 = make_loader(sampler2)
    loader2.load_state_dict(state)
    iter(loader2)
    assert np.array_equal(sampler2.estimates.value, sampler.estimates.value, equal_nan=True)
    assert np.array_equal(sampler2.estimates.count, sampler.estimates.count)


def test_every_row_once_per_epoch_and_sorted_after_first():
    sampler = make_sampler(shuffle_batch_blocks=False)
    loader = make_loader(sampler)
    batches, _ = run_steps(loader, sampler, iter(loader), 2 * N // B)
    epoch0 = sum(batches[: N // B], [])
    epoch1 = sum(batches[N // B:], [])
    assert sorted(epoch0) == list(range(N)) and sorted(epoch1) == list(range(N))
    # epoch 1 was ordered from epoch-0 estimates (bucket 64): non-decreasing buckets
    buckets = np.floor(true_length(epoch1) / 64)
    assert np.all(np.diff(buckets) >= 0)


def test_extra_state_travels_with_the_sampler():
    sampler = make_sampler()
    sampler.extra_state["cap_policy"] = {"ratios": [(0, np.array([1.5, 2.0]))]}
    loader = make_loader(sampler)
    run_steps(loader, sampler, iter(loader), 1)
    sampler2 = make_sampler()
    loader2 = make_loader(sampler2)
    loader2.load_state_dict(roundtrip(loader.state_dict()))
    assert sampler2.consume_restored_extra_state() is None  # torchdata applies the state at the next iter()
    iter(loader2)
    assert sampler2.consume_restored_extra_state()["cap_policy"]["ratios"][0][1].tolist() == [1.5, 2.0]
    assert sampler2.consume_restored_extra_state() is None
    assert sampler2.extra_state["cap_policy"]["ratios"][0][1].tolist() == [1.5, 2.0]


def test_state_from_a_different_train_set_is_refused():
    sampler = make_sampler()
    state = sampler.state_dict()
    other = LengthAwareEpochSampler(list(range(N + B)), batch_size=B)
    with pytest.raises(ValueError, match="same TRAIN_FILE"):
        other.load_state_dict(state)
