"""Cap policies: the seed formula and the calibrated one."""
import numpy as np
import pytest

from recipe.core.cap import CalibratedCap, SeedCap, make_cap_policy


def test_seed_formula():
    cap = SeedCap(16384, factor=2.0, min_tokens=1000)
    assert cap.cap_for_batch([1000, 2000, 3000]) == 4000  # 2 * mean


def test_seed_min_token_floor():
    assert SeedCap(16384, factor=2.0, min_tokens=10000).cap_for_batch([500, 700]) == 10000


def test_seed_cap_at_or_above_response_length_changes_nothing():
    assert SeedCap(16384, factor=2.0, min_tokens=10000).cap_for_batch([9000, 9000]) is None
    assert SeedCap(8192, factor=2.0, min_tokens=10000).cap_for_batch([10.0]) is None


def test_no_estimates_no_cap():
    assert SeedCap(16384).cap_for_batch([np.nan, np.nan]) is None
    assert SeedCap(16384).cap_for_batch([]) is None


def test_partial_estimates_use_the_seen_rows():
    assert SeedCap(16384, 2.0, 100).cap_for_batch([np.nan, 3000]) == 6000


def test_calibrated_needs_history_then_rounds_and_floors():
    cal = CalibratedCap(16384, quantile=0.95, history_epochs=3, align=512, min_tokens=4096)
    assert cal.cap_for_batch([3000.0]) is None  # nothing observed yet
    cal.observe(0, predicted=[1000] * 20, observed_tail=[1500] * 19 + [3000], censored=[False] * 20)
    r = cal.ratio()
    assert 1.5 <= r <= 3.0
    cap = cal.cap_for_batch([2000.0, 3000.0])
    assert cap % 512 == 0 and cap >= 3000 * r and cap - 3000 * r < 512
    assert cal.cap_for_batch([100.0]) == 4096  # floor


def test_calibrated_forgets_old_epochs():
    cal = CalibratedCap(100000, quantile=1.0, history_epochs=2, align=1, min_tokens=1)
    cal.observe(0, [100], [900], [False])
    cal.observe(1, [100], [200], [False])
    assert cal.ratio() == pytest.approx(9.0)
    cal.observe(2, [100], [150], [False])
    assert cal.ratio() == pytest.approx(2.0)


def test_calibrated_state_roundtrip():
    cal = CalibratedCap(20000)
    cal.observe(0, [1000, 2000], [1800, 2500], [False, True])
    other = CalibratedCap(20000)
    other.load_state_dict(cal.state_dict())
    assert other.ratio() == cal.ratio()


def test_make_cap_policy_rejects_unknown_mode():
    with pytest.raises(ValueError, match="cap mode"):
        make_cap_policy("tail", 1000)
