"""The cluster tests' port picking: `ray start` refuses a node whose components share a port."""

import socket

from ray_head import free_ports


def test_free_ports_are_distinct_and_free():
    ports = free_ports(64)
    assert len(set(ports)) == len(ports)
    for port in ports:  # each one can be bound right after: none was left held
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
