"""The interface counters around a gloo all-reduce match the ring model's bytes; the
counters, the job's interface and InfiniBand's port counters are read as the kernel
writes them; bad input is explained."""

from __future__ import annotations

import pytest

import workshop
from workshop.machine import interconnect
from workshop.machine.interconnect import (
    AllreduceBytes,
    infiniband_ports,
    interface_bytes,
    job_interface,
    watch_allreduce,
)


def _interface(net, name, rx, tx):
    stats = net / name / "statistics"
    stats.mkdir(parents=True)
    (stats / "rx_bytes").write_text(f"{rx}\n")
    (stats / "tx_bytes").write_text(f"{tx}\n")


def test_interface_counters_are_read_and_a_missing_one_is_named(tmp_path):
    _interface(tmp_path, "ib0", 1000, 2500)
    _interface(tmp_path, "lo", 7, 7)
    assert interface_bytes("ib0", net=tmp_path) == (1000, 2500)
    with pytest.raises(
        ValueError, match=r"no byte counters for interface 'eth9' .* has ib0, lo; pass"
    ):
        interface_bytes("eth9", net=tmp_path)


def test_this_network_namespaces_counts_come_from_proc(tmp_path):
    # /sys/class/net shows the namespace of whoever mounted /sys; /proc/self/net/dev
    # this process's, which a job or container in a namespace of its own needs.
    from workshop.machine.interconnect import _proc_net_dev

    dev = tmp_path / "dev"
    dev.write_text(
        "Inter-|   Receive                            |  Transmit\n"
        " face |bytes    packets errs drop fifo frame compressed multicast|bytes ...\n"
        "    lo: 5120      40    0    0    0     0          0         0     6144"
        "      48    0    0    0     0       0          0\n"
        "  eth0:  100       1    0    0    0     0          0         0      200"
        "       2    0    0    0     0       0          0\n"
    )
    assert _proc_net_dev(dev) == {"lo": (5120, 6144), "eth0": (100, 200)}
    assert _proc_net_dev(tmp_path / "absent") == {}
    here = _proc_net_dev()
    if "lo" in here:  # Linux: the default reads them, and they only grow
        received, sent = interface_bytes("lo")
        assert received >= here["lo"][0] and sent >= here["lo"][1]


def test_the_job_interface_comes_from_the_variables_then_the_route(
    tmp_path, monkeypatch
):
    assert job_interface({"NCCL_SOCKET_IFNAME": "ib0"}) == (
        "ib0",
        "NCCL_SOCKET_IFNAME=ib0",
    )
    assert job_interface({"NCCL_SOCKET_IFNAME": "=eth1,eth2"})[0] == "eth1"
    # An exclusion names no interface: the next source decides.
    name, why = job_interface(
        {"NCCL_SOCKET_IFNAME": "^docker", "GLOO_SOCKET_IFNAME": "lo"}
    )
    assert (name, why) == ("lo", "GLOO_SOCKET_IFNAME=lo")
    route = tmp_path / "route"
    route.write_text(
        "Iface\tDestination\tGateway\n"
        "eth0\t0000A8C0\t00000000\n"
        "ib0\t00000000\t0100A8C0\n"
    )
    assert interconnect._default_route_interface(route) == "ib0"
    assert interconnect._default_route_interface(tmp_path / "none") is None
    monkeypatch.setattr(interconnect, "_default_route_interface", lambda: "eth0")
    assert job_interface({}) == ("eth0", "the default route's (/proc/net/route)")
    monkeypatch.setattr(interconnect, "_default_route_interface", lambda: None)
    assert job_interface({}) == (
        None,
        "no interface variable set and no default route found",
    )


def test_infiniband_port_counters_count_four_bytes_per_unit(tmp_path):
    counters = tmp_path / "mlx5_0" / "ports" / "1" / "counters"
    counters.mkdir(parents=True)
    (counters / "port_xmit_data").write_text("1000\n")
    (counters / "port_rcv_data").write_text("250\n")
    broken = tmp_path / "i40iw0" / "ports" / "1" / "counters"
    broken.mkdir(parents=True)
    (broken / "port_xmit_data").write_text("N/A (no PMA)\n")
    (broken / "port_rcv_data").write_text("N/A (no PMA)\n")
    (port,) = infiniband_ports(tmp_path)
    assert (port.device, port.port, port.sent, port.received) == (
        "mlx5_0",
        "1",
        4000,
        1000,
    )
    assert infiniband_ports(tmp_path / "absent") == []


def test_the_ring_model_and_the_measured_share():
    watch = AllreduceBytes("lo", 4, 16_000_000, 2, 2 * 4 * 24_000_000, [1, 2])
    assert watch.ring_model == 24_000_000  # 2(N-1)/N = 1.5 of the tensor
    assert watch.per_rank == 24_000_000  # no per-socket counts: the interface's
    first, second = watch.describe().splitlines()
    assert first.startswith("4 ranks: 24.00 MB sent per rank") and first.endswith(
        "(1.00x)"
    )
    assert "= 24.00 MB" in first and len(first) <= 88
    assert second == "  (as lo counted them: no per-socket counts)"


def test_the_ranks_own_bytes_beside_what_the_interface_counted():
    # The ranks' own connections sent exactly the model's bytes; the interface
    # counted 0.1 % more in its fewest trial (headers), then 10 % more (others).
    own = [2 * 4 * 24_000_000, 2 * 4 * 24_000_000 + 64]
    near = AllreduceBytes("lo", 4, 16_000_000, 2, own[0] + 192_000, [1], own)
    assert near.per_rank == 24_000_000 and near.interface_per_rank == 24_024_000
    lines = near.describe().splitlines()
    assert lines[0].startswith("4 ranks: 24.00 MB sent per rank")
    assert lines[1] == (
        "  lo counted 24.02 MB per rank, headers and acks included; "
        "within 5% above: True"
    )
    assert all(len(line) <= 88 for line in lines)
    far = AllreduceBytes("lo", 4, 16_000_000, 2, int(own[0] * 1.1), [1], own)
    assert far.describe().endswith("within 5% above: False")
    # Fewer bytes on the interface than the ranks sent cannot be the same traffic.
    short = AllreduceBytes("lo", 4, 16_000_000, 2, own[0] - 1000, [1], own)
    assert short.describe().endswith("within 5% above: False")


def test_own_tcp_bytes_counts_this_processs_connections():
    import socket

    from workshop.machine.interconnect import _own_tcp_bytes

    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    try:
        before = _own_tcp_bytes()
        if before is None:
            pytest.skip("this kernel gives no per-socket byte counts (TCP_INFO)")
        client.sendall(b"x" * 100_000)
        got = 0
        while got < 100_000:
            got += len(peer.recv(65536))
        # Sent by this process's client socket; the peer's socket is ours too but
        # sent nothing.
        assert _own_tcp_bytes() - before == 100_000
    finally:
        for sock in (client, peer, server):
            sock.close()


def test_own_tcp_bytes_leaves_out_retransmissions(monkeypatch):
    # A busy machine drops loopback segments too, and tcpi_bytes_sent counts each
    # resent one again: the count is sent less retransmitted, or acked on a kernel
    # whose tcp_info ends before those fields.
    import socket
    import struct

    from workshop.machine import interconnect

    server = socket.create_server(("127.0.0.1", 0))
    try:
        sockets = interconnect._own_tcp_bytes()
        if sockets is None:
            pytest.skip("this kernel gives no per-socket byte counts (TCP_INFO)")

        def counted(length, acked, sent, retrans):
            info = bytearray(256)
            struct.pack_into("Q", info, interconnect._BYTES_ACKED, acked)
            struct.pack_into("QQ", info, interconnect._BYTES_SENT, sent, retrans)

            class Told(socket.socket):
                def getsockopt(self, *args):
                    return bytes(info[:length])

            monkeypatch.setattr(socket, "socket", Told)
            try:
                return interconnect._own_tcp_bytes()
            finally:
                monkeypatch.undo()

        ones = counted(256, 1, 1, 0)  # this process's TCP sockets, the server's too
        assert ones >= 1
        assert counted(256, 700, 1000, 300) == 700 * ones
        assert counted(interconnect._BYTES_ACKED + 8, 700, 1000, 300) == 700 * ones
    finally:
        server.close()


def test_bad_input_is_explained():
    with pytest.raises(ValueError, match=r"size_bytes must be 4 or more .*got 2"):
        watch_allreduce(2)
    with pytest.raises(
        ValueError, match=r"world_size must be a whole number, 2 or more, not 1"
    ):
        watch_allreduce(world_size=1)
    with pytest.raises(ValueError, match=r"repeats must be a whole number, 1 or more"):
        watch_allreduce(repeats=0)
    with pytest.raises(ValueError, match=r"trials must be a whole number, 1 or more"):
        watch_allreduce(trials=1.5)
    with pytest.raises(ValueError, match=r"no byte counters for interface 'nosuch0'"):
        watch_allreduce(interface="nosuch0")


@pytest.mark.timeout(180)
def test_loopback_carries_what_the_ring_model_says(capfd):
    # Two gloo ranks on this machine (a GPU node too): each sends 2(N-1)/N of the
    # tensor, and loopback counts every rank's bytes. Headers and other programs'
    # traffic can only add to it; the fewest of three trials is kept.
    watch = workshop.machine.watch_allreduce(4e6, world_size=2, repeats=2, trials=3)
    assert watch.interface in ("lo", "lo0") and len(watch.trials) == 3
    assert watch.sent == min(watch.trials)
    assert 0.99 * watch.ring_model <= watch.interface_per_rank <= 1.3 * watch.ring_model
    # The ranks' own connections: the model's bytes, plus a few hundred of the
    # barriers around the reading, whatever else the machine sends.
    assert len(watch.own_trials) == 3
    assert watch.ring_model <= watch.per_rank <= 1.001 * watch.ring_model
    assert watch.per_rank <= watch.interface_per_rank
