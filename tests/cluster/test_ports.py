"""The portal's ports: free, different, and below the range the system hands out to
outgoing connections by itself, so that no connection can take one before the hub
and its proxy bind it."""

from __future__ import annotations

import socket

import pytest

from workshop.cluster.ports import LOWEST, ephemeral_start, quiet_ports


def test_three_ports_free_different_and_below_the_systems_own_range():
    ports = quiet_ports(3)
    assert len(set(ports)) == 3
    assert all(LOWEST <= p < ephemeral_start() for p in ports), ports
    for port in ports:  # free: each can be bound now
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_the_range_is_read_from_the_system(tmp_path):
    conf = tmp_path / "ip_local_port_range"
    conf.write_text("40000\t60999\n")
    assert ephemeral_start(str(conf)) == 40000
    assert all(LOWEST <= p < 40000 for p in quiet_ports(5, str(conf)))
    # A range that starts too low to leave room below: ports from the range itself.
    conf.write_text("1024 65535\n")
    assert all(1024 <= p < 65536 for p in quiet_ports(2, str(conf)))
    # Unreadable: Linux's default.
    assert ephemeral_start(str(tmp_path / "missing")) == 32768


@pytest.mark.parametrize("count", [0, -1, 2.0, True, "3"])
def test_a_count_that_is_not_a_positive_whole_number_is_refused(count):
    with pytest.raises(ValueError, match=rf"count must be .*; got {count!r}"):
        quiet_ports(count)
