"""``free_port``: the loopback ports the benchmark and the tests give their daemons."""

from __future__ import annotations

import socket

from streamer.bench.bench_config import free_port


def test_free_port_never_gives_a_port_twice_and_gives_bindable_ones() -> None:
    # The OS may pick a closed probe's port again at once; a daemon given one port for its
    # ingress and its egress would fail to start.
    ports = [free_port() for _ in range(2000)]
    assert len(set(ports)) == len(ports)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", ports[-1]))
