"""``cis infer`` and :class:`cis.Client` refuse numbers that cannot work in one line (issue 43: a mistake is one
line and exit 2): a ``--window`` of 0 waited forever, a ``--rate`` of 0 divided by zero, a ``--batch-size`` of 0
raised from ``range``, a negative rate sent as fast as it could. Checked before any data is read or sent."""

from __future__ import annotations

import numpy as np
import pytest

from cis.core.errors import CisError
from cis.runtime.client import Client, check_pacing, infer_spread


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (("--rate", "0"), "--rate is 0; expected requests per second > 0"),
        (("--rate", "-5"), "--rate is -5; expected requests per second > 0"),
        (("--window", "0"), "--window is 0; expected requests in flight per node >= 1"),
        (("--batch-size", "0"), "--batch-size is 0; expected samples per request >= 1"),
        (("--n", "0"), "--n is 0; expected samples >= 1"),
        (("--timeout", "0"), "--timeout is 0; expected seconds > 0"),
    ],
)
def test_a_number_that_cannot_work_is_one_line(flags, said, run_cli, tmp_path):
    data = tmp_path / "x.npz"
    np.savez(data, x=np.zeros((4, 1, 8, 8), np.float32), y=np.zeros(4, np.int64))
    res = run_cli("infer", "--connect", "tcp://127.0.0.1:1", "--dataset", str(data), *flags)
    lines = res.err.strip().splitlines()
    assert res.code == 2 and len(lines) == 1 and lines[0].startswith(f"cis infer: error: {said}"), res.err


def test_the_client_refuses_them_before_sending():
    x = np.zeros((4, 1, 8, 8), np.float32)
    with Client("tcp://127.0.0.1:1", timeout=1) as c:
        for kwargs, said in (({"window": 0}, "window is 0"), ({"rate": 0.0}, "rate is 0.0"),
                             ({"batch_size": 0}, "batch size is 0"), ({"rate": -1.0}, "rate is -1.0")):
            with pytest.raises(CisError, match=said):
                c.infer_many(x, **kwargs)
        with pytest.raises(CisError, match="window is 0"):
            infer_spread({"d": c}, x, {"d": np.arange(4)}, window=0)
        assert c.in_flight == 0  # nothing was sent
    check_pacing(1, None)  # the defaults pass
