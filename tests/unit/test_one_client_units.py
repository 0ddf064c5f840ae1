"""Whether a request is the server's one client's: counted HTTP connections, gRPC calls in flight."""

from __future__ import annotations

from workbench.planes.one_client import GRPC_PROTOCOLS, OneClient


def test_an_http_request_is_one_clients_while_every_port_together_holds_one_connection() -> None:
    rest, openai = [1], [0]
    one_client = OneClient()
    assert not one_client.alone("rest"), "no port counted yet: nothing is known"
    one_client.watch(lambda: rest[0])
    one_client.watch(lambda: openai[0])
    assert one_client.alone("rest") and one_client.alone("v2-rest") and one_client.alone("openai")
    openai[0] = 1  # a second client, on the other port
    assert not one_client.alone("rest")
    rest[0], openai[0] = 0, 1
    assert one_client.alone("openai")
    rest[0], openai[0] = 2, 0
    assert not one_client.alone("rest")


def test_a_grpc_call_is_never_one_clients_and_while_one_is_in_flight_no_request_is() -> None:
    one_client = OneClient()
    one_client.watch(lambda: 1)
    for protocol in GRPC_PROTOCOLS:
        assert not one_client.alone(protocol), protocol
    one_client.grpc_calls = 1
    assert not one_client.alone("rest")
    one_client.grpc_calls = 0
    assert one_client.alone("rest")


def test_a_server_that_cannot_count_a_ports_connections_is_never_one_clients() -> None:
    one_client = OneClient()
    one_client.watch(lambda: 1)
    one_client.watch(None)  # granian's port
    assert not one_client.alone("rest")
