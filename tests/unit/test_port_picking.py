"""The test helpers that pick ports for servers which cannot be given port 0 (Ray's nodes and their agents)."""

from __future__ import annotations

import socket

from tests.waiting import agent_ports, free_port, free_ports


def test_ports_picked_together_differ_and_avoid_the_ones_taken() -> None:
    # CI saw a Ray node refused: its metrics-export port, picked a moment before, was handed out again for its
    # runtime-env agent. A port just closed is the one the kernel is likeliest to hand out next, so take it.
    for _ in range(50):
        taken = free_port()
        ports = free_ports(8, taken=[taken])
        assert len(set(ports)) == 8
        assert taken not in ports
        agents = agent_ports(taken=[taken])
        names = {"metrics_agent_port", "dashboard_agent_listen_port", "runtime_env_agent_port", "metrics_export_port"}
        assert set(agents) == names
        assert len(set(agents.values())) == 4 and taken not in agents.values()


def test_a_picked_port_is_free_to_listen_on() -> None:
    for port in free_ports(3):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
            sock.listen()
