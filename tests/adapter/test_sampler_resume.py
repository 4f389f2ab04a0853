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


def run_steps(loader, sampler, it, k, tool_calls=None):
    """Consume k batches the way verl does (re-iterating at epoch end) and feed back lengths like step(); with
    ``tool_calls`` (rows -> calls) each response's tool calls too, 2 s each, as the trainer does."""
    out = []
    for _ in range(k):
        try:
            batch = next(it)
        except StopIteration:
            it = iter(loader)
            batch = next(it)
        rows = np.repeat(batch, 2)
        if tool_calls is None:
            sampler.update(rows, true_length(rows))
        else:
            calls = tool_calls(rows)
            sampler.update(rows, true_length(rows), tool_calls=calls, tool_s=2.0 * calls)
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


# -- order_by=time: the time key's tool state in the sampler and its checkpoint -----------------------------------
def tool_calls_of(rows):
    """The shortest rows make the most tool calls, so the time order differs from the token order."""
    return (9 - (true_length(rows) // 112)).clip(0, 9)


def run_tool_steps(loader, sampler, it, k):
    return run_steps(loader, sampler, it, k, tool_calls=tool_calls_of)


def test_order_by_time_sorts_the_next_epoch_by_expected_time():
    by_time = make_sampler(shuffle_batch_blocks=False, order_by="time", time_tokens_per_s=50.0)
    by_tokens = make_sampler(shuffle_batch_blocks=False)
    epochs = {}
    for name, sampler in (("time", by_time), ("tokens", by_tokens)):
        loader = make_loader(sampler)
        batches, _ = run_tool_steps(loader, sampler, iter(loader), 2 * N // B)
        epochs[name] = np.array(sum(batches[N // B:], []))
    assert by_time.time_key.mean_latency_s() == 2.0
    key = true_length(np.arange(N)) + tool_calls_of(np.arange(N)) * 2.0 * 50.0
    assert np.allclose(by_time.time_key.filled(), key)
    # bucket 64 on the key, then the key: non-decreasing expected time, and not the token order
    assert np.all(np.diff(key[epochs["time"]]) >= 0)
    assert np.all(np.diff(true_length(epochs["tokens"])) >= 0)
    assert not np.array_equal(epochs["time"], epochs["tokens"])
    # the token estimates are the same in both (what caps and priorities read)
    assert np.array_equal(by_time.estimates.value, by_tokens.estimates.value)


def test_order_by_time_resumes_with_its_tool_state():
    sampler = make_sampler(order_by="time")
    loader = make_loader(sampler)
    _, it = run_tool_steps(loader, sampler, iter(loader), 17)
    calls_17 = sampler.time_key.latency_calls
    assert calls_17 > 0 and sampler.time_key.calls.seen.all()
    state = roundtrip(loader.state_dict())
    expected, _ = run_tool_steps(loader, sampler, it, 30)

    sampler2 = make_sampler(order_by="time")
    loader2 = make_loader(sampler2)
    loader2.load_state_dict(state)
    it2 = iter(loader2)
    # restored exactly (checked before the continuation changes them)
    assert (sampler2.time_key.latency_sum_s, sampler2.time_key.latency_calls) == (2.0 * calls_17, calls_17)
    got, _ = run_tool_steps(loader2, sampler2, it2, 30)
    assert got == expected
    assert np.array_equal(sampler2.time_key.calls.value, sampler.time_key.calls.value, equal_nan=True)
    assert (sampler2.time_key.latency_sum_s, sampler2.time_key.latency_calls) == \
        (sampler.time_key.latency_sum_s, sampler.time_key.latency_calls)


def test_a_checkpoint_without_tool_state_loads_into_a_time_sampler():
    """A tokens run (or one from before the time key) resumed with order_by=time: its estimates and order come
    back, the tool state starts empty (the order is the token order until tool calls are seen)."""
    old = make_sampler()
    loader = make_loader(old)
    run_steps(loader, old, iter(loader), 14)
    assert "tool_calls" not in old.state_dict()["plan"]["estimates"]
    state = roundtrip(loader.state_dict())
    sampler = make_sampler(order_by="time")
    loader2 = make_loader(sampler)
    loader2.load_state_dict(state)
    iter(loader2)
    assert np.array_equal(sampler.estimates.value, old.estimates.value, equal_nan=True)
    assert np.array_equal(sampler.plan.order, old.plan.order) and sampler.plan.position == old.plan.position
    assert not sampler.time_key.calls.seen.any() and sampler.time_key.mean_latency_s() == 0.0
    assert np.array_equal(sampler.time_key.filled(), old.estimates.filled())


def test_order_by_tokens_ignores_tool_calls_and_keeps_its_state():
    """The default: tool information changes nothing, and the state holds no tool fields."""
    plain, fed = make_sampler(), make_sampler()
    assert fed.time_key is None
    loaders = [make_loader(s) for s in (plain, fed)]
    a, _ = run_steps(loaders[0], plain, iter(loaders[0]), 30)
    b, _ = run_tool_steps(loaders[1], fed, iter(loaders[1]), 30)
    assert a == b
    sa, sb = plain.state_dict(), fed.state_dict()
    assert set(sb["plan"]["estimates"]) == {"value", "count", "censored", "row_prior", "ema_decay", "statistic"}
    assert set(sa) == set(sb) == {"plan", "extra", "num_rows"}
    assert torch.equal(sa["plan"]["estimates"]["value"], sb["plan"]["estimates"]["value"])


def test_unknown_order_by_is_refused():
    with pytest.raises(ValueError, match="order_by 'speed'"):
        make_sampler(order_by="speed")
