"""The exit policy: confidence measures, routing by quota and by threshold, calibration, token bucket."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cis.core.errors import CisError
from cis.core.policy.exit_policy import ExitPolicy, assign_entries, calibrate_thresholds, confidence, evaluate_cis
from cis.core.policy.transfer_cap import TokenBucket
from cis.core.rates import compute_rates
from cis.core.topologies import make_spec


def test_confidence_measures():
    logits = np.array([[10.0, 0.0, 0.0], [0.0, 0.0, 0.0], [2.0, 2.0, -5.0]])
    ms = confidence(logits, "max_softmax")
    assert ms[0] > 0.99 and ms[1] == pytest.approx(1 / 3)
    ent = confidence(logits, "entropy")
    assert ent[0] > 0.9 and ent[1] == pytest.approx(0.0, abs=1e-9)
    mg = confidence(logits, "margin")
    assert mg[2] == pytest.approx(0.0, abs=1e-6) and mg[0] > 0.99
    with pytest.raises(CisError, match="unknown"):
        confidence(logits, "nope")


def test_max_softmax_is_the_largest_softmax_probability_to_the_bit():
    """The runtime's cheaper max_softmax (1 / sum exp(z - max z)) decides exactly as softmax(z).max() would."""
    from cis.core.policy.confidence import softmax

    rng = np.random.default_rng(3)
    for dtype in (np.float16, np.float32, np.float64):
        for scale in (0.01, 1.0, 30.0, 1000.0):
            z = (rng.standard_normal((500, 10)) * scale).astype(dtype)
            np.testing.assert_array_equal(confidence(z, "max_softmax"), softmax(z).max(axis=-1))


def test_assign_entries_follows_arrival_rates():
    spec = make_spec("paper-7", "80-15-5")
    entries = assign_entries(spec, 1000, seed=1)
    assert set(entries) == {"device0", "device1", "device2", "device3"}
    assert all(len(v) == 250 for v in entries.values())
    assert sorted(np.concatenate(list(entries.values())).tolist()) == list(range(1000))
    again = assign_entries(spec, 1000, seed=1)
    assert all((entries[k] == again[k]).all() for k in entries)


def synthetic_logits(n=4000, seed=0, classes=10):
    """Exit e is right more often than exit e-1; confidence tracks correctness."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n)
    logits = {}
    for e, skill in zip((1, 2, 3), (1.0, 2.0, 3.0)):
        z = rng.normal(size=(n, classes))
        z[np.arange(n), labels] += skill * rng.uniform(0, 2, n)
        logits[e] = z
    return logits, labels


@pytest.mark.parametrize("setting", ["80-15-5", "33-33-33", "5-15-80"])
def test_quota_evaluation_serves_exact_shares(setting):
    spec = make_spec("paper-7", setting)
    logits, labels = synthetic_logits()
    ev = evaluate_cis(spec, logits, labels)
    target = compute_rates(spec).exit_share
    for e in (1, 2, 3):
        assert ev.exit_shares[e] == pytest.approx(target[e], abs=1e-9)
    assert sum(ev.node_shares.values()) == pytest.approx(1.0)


def test_quota_serves_most_confident_so_beats_random():
    spec = make_spec("paper-7", "80-15-5")
    logits, labels = synthetic_logits()
    ev = evaluate_cis(spec, logits, labels)
    # Random serving would give the share-weighted exit accuracy; confidence ranking must do better.
    random_acc = sum(ev.exit_accuracy[e] * s for e, s in ev.exit_shares.items())
    assert ev.accuracy > random_acc + 0.02


def test_all_at_root_equals_final_exit_accuracy():
    spec = make_spec("paper-7", "0-0-100")
    logits, labels = synthetic_logits()
    ev = evaluate_cis(spec, logits, labels)
    assert ev.accuracy == pytest.approx(ev.exit_accuracy[3])


def test_calibrated_thresholds_reproduce_shares_on_fresh_data():
    spec = make_spec("paper-7", "60-30-10")
    val_logits, _ = synthetic_logits(seed=1)
    conf = {e: confidence(v, "max_softmax") for e, v in val_logits.items()}
    policy = calibrate_thresholds(spec, conf)
    assert policy.thresholds["cloud"] == -math.inf
    test_logits, test_labels = synthetic_logits(seed=2)
    ev = evaluate_cis(spec, test_logits, test_labels, policy=policy)
    for e, share in zip((1, 2, 3), (0.6, 0.3, 0.1)):
        assert ev.exit_shares[e] == pytest.approx(share, abs=0.03)
    # On the calibration data itself the shares are reproduced almost exactly.
    ev_val = evaluate_cis(spec, val_logits, np.zeros(len(conf[1]), dtype=int), policy=policy)
    assert ev_val.exit_shares[1] == pytest.approx(0.6, abs=0.005)


def test_policy_decide_and_json_round_trip():
    policy = ExitPolicy("max_softmax", {"a": 0.5, "root": -math.inf, "never": math.inf})
    serve, conf = policy.decide("a", np.array([[5.0, 0.0], [0.0, 0.0]]))
    assert serve.tolist() == [True, True]  # 0.5 >= 0.5 on the tie
    assert policy.decide("never", np.array([[50.0, 0.0]]))[0].tolist() == [False]
    again = ExitPolicy.from_json(policy.to_json())
    assert again.thresholds == policy.thresholds


def test_token_bucket_caps_rate():
    bucket = TokenBucket(rate=10.0, burst=1.0)
    granted = sum(bucket.take(t / 1000) for t in range(10_000))  # 1000 tries/s for 10 s
    assert granted == pytest.approx(100, abs=2)
    assert not TokenBucket(0.0, burst=0.0).take(1.0)
    assert TokenBucket(math.inf).take(0.0)


def test_token_bucket_grants_a_batch_as_takes_one_by_one():
    rng = np.random.default_rng(0)
    one, many = TokenBucket(rate=50.0, burst=20.0), TokenBucket(rate=50.0, burst=20.0)
    now = 0.0
    for _ in range(300):
        now += float(rng.exponential(0.05))
        n = int(rng.integers(0, 12))
        one.take(now, 0.0)  # a refill, as grant does
        assert many.grant(now, n) == sum(one.take(now) for _ in range(n))
        assert many.tokens == pytest.approx(one.tokens)
    assert TokenBucket(math.inf).grant(0.0, 7) == 7 and TokenBucket(0.0, burst=0.0).grant(1.0, 3) == 0
