"""The fault schedule (cis.core.faults): one file format for cis testbed --faults and cis simulate --faults."""

from __future__ import annotations

import pytest

from cis.core.errors import CisError
from cis.core.faults import Fault, check_faults, parse_fault, read_faults
from cis.core.topologies import make_spec


def test_a_fault_file_is_read_in_time_order_with_comments(tmp_path):
    path = tmp_path / "faults.txt"
    path.write_text(
        "# at action link value\n20 up edge0\n\n10 down edge0   # the partition\n30 bandwidth device1 2.5e5\n"
    )
    assert read_faults(path) == (
        Fault(10.0, "down", "edge0"),
        Fault(20.0, "up", "edge0"),
        Fault(30.0, "bandwidth", "device1", 250000.0),
    )


@pytest.mark.parametrize(
    "line, message",
    [
        ("10 down", "expected 'AT down|up NODE'"),
        ("soon down edge0", "time 'soon' is not a number"),
        ("-1 down edge0", "expected seconds >= 0"),
        ("10 reboot edge0", "action 'reboot'; expected one of down, up, bandwidth"),
        ("10 bandwidth edge0", "'bandwidth' needs one value"),
        ("10 bandwidth edge0 fast", "bandwidth 'fast' is not a number"),
        ("10 bandwidth edge0 0", "expected bytes/s > 0 or inf"),
        ("10 down edge0 now", "'down' takes no value"),
    ],
)
def test_bad_lines_say_what_and_where(line, message):
    with pytest.raises(CisError, match=message) as err:
        parse_fault(line, "f.txt:3")
    assert str(err.value).startswith("f.txt:3: ") and "\n" not in str(err.value)


def test_faults_must_name_a_node_with_an_uplink(tmp_path):
    spec = make_spec("paper-7", "60-30-10")
    check_faults((Fault(1.0, "down", "edge0"),), spec)
    with pytest.raises(CisError, match="no node 'edge9'"):
        check_faults((Fault(1.0, "down", "edge9"),), spec)
    with pytest.raises(CisError, match="'cloud' is the root and has no uplink"):
        check_faults((Fault(1.0, "down", "cloud"),), spec)
    with pytest.raises(CisError, match="cannot read"):
        read_faults(tmp_path / "missing.txt")
