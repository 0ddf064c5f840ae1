"""TensorFlow's profiler service on the gRPC port, as tensorflow_model_server has it: TensorFlow's own profiler
client traces a serving server over its gRPC port and gets a trace TensorBoard's profile plugin reads (XSpace)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import requests

from workbench.server import ServerThread


def test_a_trace_of_the_serving_process_comes_through_the_grpc_port(
    serve: Callable[..., ServerThread], make_repo: Callable[..., Path], tmp_path: Path
) -> None:
    from tensorflow.python.profiler import profiler_client
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    server = serve(model_base_path=str(make_repo("hp", {1: "hp2_tf2"})), model_name="hp")
    stop = threading.Event()

    def predict_meanwhile() -> None:  # as TF Serving's own test does: requests while the trace runs
        while not stop.is_set():
            requests.post(f"{server.rest_url}/v1/models/hp:predict", json={"instances": [2.0, 3.0]}, timeout=30)
            stop.wait(0.05)

    sender = threading.Thread(target=predict_meanwhile)
    sender.start()
    try:
        profiler_client.trace(f"grpc://{server.grpc_target}", str(tmp_path / "logs"), 1000, "", 5)
    finally:
        stop.set()
        sender.join()
    (trace,) = (tmp_path / "logs" / "plugins" / "profile").glob("*/*.xplane.pb")
    space = xplane_pb2.XSpace.FromString(trace.read_bytes())
    assert space.planes and any(plane.lines for plane in space.planes)
