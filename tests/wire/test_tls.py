"""TLS: gRPC with TF Serving's ``--ssl_config_file`` (mutual TLS included), REST with ``--rest_api_ssl_*``, and every
workbench client (``Client``, ``workbench bench``, the notebook handle, the dashboard's stream, Jupyter's proxy)
talking to a TLS server.

Certificates come from trustme: a test CA, a server certificate for 127.0.0.1 and localhost, a client certificate
for mutual TLS, and a second CA nobody trusts. Servers are real (a ``workbench serve`` child of a notebook handle,
or a ServerThread), clients are the real ones (TF Serving's generated stubs over ``grpc.secure_channel``,
``requests``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import requests
import trustme
from google.protobuf import text_format
from tornado.httpclient import HTTPClientError

import workbench.runtime.tensorflow_protos  # noqa: F401  # isort: skip  (TF Serving's protos without TensorFlow)
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from workbench.cli import main
from workbench.client import Client
from workbench.config.options import ServerOptions, parse_ssl_config_file
from workbench.config.tf_serving_protos import SSLConfig
from workbench.core.errors import Code, ServingError
from workbench.jupyter import server_records as registry
from workbench.notebook.handle import ServerHandle
from workbench.server import ServerThread

pytest_plugins = ["pytest_jupyter.jupyter_server"]

DT_FLOAT = 1  # tensorflow.DataType


@dataclasses.dataclass(frozen=True)
class Pki:
    """The test's certificates, as PEM files."""

    ca: Path  # signs the server's and the client's certificates
    other_ca: Path  # signs nothing here: a client trusting only it must fail
    server_cert: Path  # the chain, for 127.0.0.1 and localhost
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path  # a client certificate from other_ca
    stranger_key: Path
    ssl_config: Path  # SSLConfig: server_key, server_cert
    mtls_config: Path  # ... and custom_ca (ca), client_verify


def write_ssl_config(path: Path, **fields: Any) -> Path:
    """An SSLConfig text proto, written by protobuf's text_format as a TF Serving user would hand to it."""
    path.write_text(text_format.MessageToString(SSLConfig(**fields)))
    return path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    ca, other_ca = trustme.CA(), trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("client.workbench.test")
    stranger = other_ca.issue_cert("stranger.workbench.test")

    def write(name: str, data: bytes) -> Path:
        (folder / name).write_bytes(data)
        return folder / name

    server_chain = b"".join(blob.bytes() for blob in server.cert_chain_pems)
    return Pki(
        ca=write("ca.pem", ca.cert_pem.bytes()),
        other_ca=write("other-ca.pem", other_ca.cert_pem.bytes()),
        server_cert=write("server.pem", server_chain),
        server_key=write("server.key", server.private_key_pem.bytes()),
        client_cert=write("client.pem", b"".join(blob.bytes() for blob in client.cert_chain_pems)),
        client_key=write("client.key", client.private_key_pem.bytes()),
        stranger_cert=write("stranger.pem", b"".join(blob.bytes() for blob in stranger.cert_chain_pems)),
        stranger_key=write("stranger.key", stranger.private_key_pem.bytes()),
        ssl_config=write_ssl_config(
            folder / "ssl.config",
            server_key=server.private_key_pem.bytes().decode(),
            server_cert=server_chain.decode(),
        ),
        mtls_config=write_ssl_config(
            folder / "mtls.config",
            server_key=server.private_key_pem.bytes().decode(),
            server_cert=server_chain.decode(),
            custom_ca=ca.cert_pem.bytes().decode(),
            client_verify=True,
        ),
    )


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory, model_store: Path) -> Path:
    """A repository with ``hp`` (half_plus_two: y = x / 2 + 2)."""
    root = tmp_path_factory.mktemp("tls-models")
    shutil.copytree(model_store / "hp2_tf2", root / "hp" / "1")
    return root


@pytest.fixture(scope="module")
def tls_server(pki: Pki, repository: Path) -> Iterator[ServerHandle]:
    """A real ``workbench serve`` process (a notebook handle's) with TLS on gRPC and REST."""
    handle = ServerHandle(
        repository,
        server_name="tls",
        ssl_config_file=pki.ssl_config,
        rest_api_ssl_cert_file=pki.server_cert,
        rest_api_ssl_key_file=pki.server_key,
        ca_file=pki.ca,
    ).start()
    try:
        handle.wait_for_version("hp")
        yield handle
    finally:
        handle.stop()


def predict_request(x: float) -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "hp"
    tensor = request.inputs["x"]
    tensor.dtype = DT_FLOAT
    tensor.tensor_shape.dim.add(size=1)
    tensor.tensor_shape.dim.add(size=1)
    tensor.float_val.append(x)
    return request


def stub_predict(channel: grpc.Channel, x: float = 1.0) -> list[float]:
    """TF Serving's own generated stub: the answer's ``y``."""
    response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(predict_request(x), timeout=20)
    return list(response.outputs["y"].float_val)


def refused_code(channel: grpc.Channel) -> grpc.StatusCode:
    """The code a Predict on ``channel`` fails with (it must fail, and at once: no wait_for_ready)."""
    with pytest.raises(grpc.RpcError) as refused:
        stub_predict(channel)
    return refused.value.code()  # type: ignore[no-any-return]


def credentials(pki: Pki, ca: Path | None = None, client: tuple[Path, Path] | None = None) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=(ca or pki.ca).read_bytes(),
        private_key=client[1].read_bytes() if client else None,
        certificate_chain=client[0].read_bytes() if client else None,
    )


# ------------------------------------------------------------------------------------ one-way TLS, both ports
def test_the_ready_file_health_and_jupyter_record_say_tls(tls_server: ServerHandle, pki: Pki) -> None:
    assert tls_server.rest_url.startswith("https://127.0.0.1:")
    health = tls_server.client.health()
    assert (health["rest_scheme"], health["grpc_tls"]) == ("https", True)
    (record,) = [r for r in registry.list_servers() if r.pid == tls_server.pid]
    assert (record.tls, record.grpc_tls, record.tls_client_auth) == (True, True, False)
    assert record.tls_cert_file == str(pki.server_cert.resolve())
    assert "https://" in repr(tls_server)


def test_tf_serving_stub_predicts_over_a_secure_channel(tls_server: ServerHandle, pki: Pki) -> None:
    with grpc.secure_channel(tls_server.grpc_target, credentials(pki)) as channel:
        assert stub_predict(channel, 3.0) == [3.5]


def test_plaintext_and_untrusting_grpc_clients_are_refused(tls_server: ServerHandle, pki: Pki) -> None:
    with grpc.insecure_channel(tls_server.grpc_target) as plaintext:
        assert refused_code(plaintext) == grpc.StatusCode.UNAVAILABLE
    with grpc.secure_channel(tls_server.grpc_target, credentials(pki, ca=pki.other_ca)) as untrusting:
        assert refused_code(untrusting) == grpc.StatusCode.UNAVAILABLE


def test_rest_is_https_checked_against_its_ca(tls_server: ServerHandle, pki: Pki) -> None:
    url = f"{tls_server.rest_url}/v1/models/hp:predict"
    answer = requests.post(url, json={"instances": [[1.0]]}, verify=str(pki.ca), timeout=20)
    assert answer.status_code == 200 and answer.json() == {"predictions": [[2.5]]}
    with pytest.raises(requests.exceptions.SSLError):  # the default trust store does not know the test CA
        requests.post(url, json={"instances": [[1.0]]}, verify=True, timeout=20)
    with pytest.raises(requests.exceptions.ConnectionError):  # plain HTTP on the TLS port
        requests.post(url.replace("https://", "http://"), json={"instances": [[1.0]]}, timeout=20)


@pytest.mark.parametrize("protocol", ["rest", "grpc", "v2-rest", "v2-grpc"])
def test_workbench_client_with_a_ca_file(tls_server: ServerHandle, pki: Pki, protocol: str) -> None:
    with Client(tls_server.rest_url, tls_server.grpc_target, protocol=protocol, ca_file=str(pki.ca)) as client:
        assert client.predict("hp", [[1.0]])["y"].tolist() == [[2.5]]


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
def test_workbench_client_without_the_ca_is_refused(tls_server: ServerHandle, protocol: str) -> None:
    # https and tls=True, nothing else: the default trust store, which does not know the test CA.
    with Client(tls_server.rest_url, tls_server.grpc_target, protocol=protocol, tls=True, timeout=20) as client:
        with pytest.raises(ServingError) as refused:
            client.predict("hp", [[1.0]])
    assert refused.value.code == Code.UNAVAILABLE


def test_the_handles_client_and_the_dashboards_stream(tls_server: ServerHandle) -> None:
    assert tls_server.client.predict("hp", [[1.0]], protocol="grpc")["y"].tolist() == [[2.5]]
    # The dashboard's chart follows the stats stream through its client: over TLS too.
    stream = tls_server.client.open_stream("/workbench/v1/stats/stream", {"interval": 0.1}, (5, 30))
    with stream as response:
        first = next(line for line in response.iter_lines() if line.startswith(b"data: "))
    assert "models" in json.loads(first[6:])


@pytest.mark.parametrize("protocol", ["rest", "grpc"])
def test_workbench_bench_over_tls(
    tls_server: ServerHandle, pki: Pki, protocol: str, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tls_server.rest_url if protocol == "rest" else tls_server.grpc_target
    load = [f"--target={target}", f"--protocol={protocol}", "--model=hp", '--inputs={"x": [[1.0]]}', "--requests=40"]
    assert main(["bench", *load, f"--ca_file={pki.ca}", "--concurrency=2", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["requests"], summary["errors"]) == (40, 0)

    untrusting = "--tls" if protocol == "grpc" else f"--ca_file={pki.other_ca}"
    assert main(["bench", *load, untrusting]) == 1
    err = capsys.readouterr().err
    assert err.startswith("workbench bench: ") and "Traceback" not in err


def test_bench_refuses_tls_files_with_a_plain_http_target(pki: Pki, capsys: pytest.CaptureFixture[str]) -> None:
    words = ["bench", "--target=http://127.0.0.1:1", "--model=hp", '--inputs={"x": [[1.0]]}', f"--ca_file={pki.ca}"]
    assert main(words) == 2
    assert "TLS over REST needs an https:// --target" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ mutual TLS
@pytest.fixture
def mtls_server(serve: Callable[..., ServerThread], pki: Pki, repository: Path) -> ServerThread:
    return serve(
        model_repository=str(repository),
        ssl_config_file=str(pki.mtls_config),
        rest_api_ssl_cert_file=str(pki.server_cert),
        rest_api_ssl_key_file=str(pki.server_key),
        rest_api_ssl_client_ca_file=str(pki.ca),
    )


def test_mutual_tls_on_grpc_needs_a_client_certificate_from_custom_ca(mtls_server: ServerThread, pki: Pki) -> None:
    target = mtls_server.grpc_target
    with grpc.secure_channel(target, credentials(pki)) as anonymous:
        assert refused_code(anonymous) == grpc.StatusCode.UNAVAILABLE
    with grpc.secure_channel(target, credentials(pki, client=(pki.stranger_cert, pki.stranger_key))) as stranger:
        assert refused_code(stranger) == grpc.StatusCode.UNAVAILABLE
    with grpc.secure_channel(target, credentials(pki, client=(pki.client_cert, pki.client_key))) as known:
        assert stub_predict(known) == [2.5]


def test_mutual_tls_on_rest_needs_a_client_certificate(mtls_server: ServerThread, pki: Pki) -> None:
    url = f"{mtls_server.rest_url}/v1/models/hp"
    assert url.startswith("https://")
    with pytest.raises(requests.exceptions.ConnectionError):  # the handshake is refused without one
        requests.get(url, verify=str(pki.ca), timeout=20)
    answer = requests.get(url, verify=str(pki.ca), cert=(str(pki.client_cert), str(pki.client_key)), timeout=20)
    assert answer.status_code == 200
    (record,) = [r for r in registry.list_servers() if r.rest_port == mtls_server.server.rest_port]
    assert record.tls_client_auth is True


def test_an_https_drain_lets_idle_keep_alive_clients_go_at_once(
    serve: Callable[..., ServerThread], pki: Pki, repository: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A client's idle keep-alive connection (a requests Session, a load balancer's pool) never sends TLS's
    close_notify by itself: a drain that closed it gracefully waited for one until its budget ran out, every time."""
    server = serve(
        model_repository=str(repository),
        rest_api_ssl_cert_file=str(pki.server_cert),
        rest_api_ssl_key_file=str(pki.server_key),
        drain_seconds=20,
    )
    with requests.Session() as session:
        answer = session.get(f"{server.rest_url}/v1/models/hp", verify=str(pki.ca), timeout=20)
        assert answer.status_code == 200  # the session keeps its connection open, idle
        with caplog.at_level(logging.INFO, logger="workbench.server"):
            server.stop()
    said = caplog.text
    assert "Every accepted request finished" in said and "Drain budget" not in said, said


@pytest.mark.parametrize("protocol", ["rest", "grpc", "v2-grpc"])
def test_workbench_client_with_a_client_certificate(mtls_server: ServerThread, pki: Pki, protocol: str) -> None:
    files = {"ca_file": str(pki.ca), "cert_file": str(pki.client_cert), "key_file": str(pki.client_key)}
    with Client(mtls_server.rest_url, mtls_server.grpc_target, protocol=protocol, **files) as client:
        assert client.predict("hp", [[1.0]])["y"].tolist() == [[2.5]]


def test_client_verify_without_custom_ca_trusts_grpcs_default_roots_as_tf_serving_does(
    serve: Callable[..., ServerThread], pki: Pki, repository: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # TF Serving leaves pem_root_certs unset: gRPC's default roots (public CAs) check client certificates.
    config = write_ssl_config(
        tmp_path / "verify.config",
        server_key=pki.server_key.read_text(),
        server_cert=pki.server_cert.read_text(),
        client_verify=True,
    )
    with caplog.at_level(logging.WARNING, logger="workbench.config.options"):
        server = serve(model_repository=str(repository), ssl_config_file=str(config))
    assert "client_verify without custom_ca" in caplog.text
    # A client certificate from a private CA is not one a public CA issued: refused.
    with grpc.secure_channel(server.grpc_target, credentials(pki, client=(pki.client_cert, pki.client_key))) as ch:
        assert refused_code(ch) == grpc.StatusCode.UNAVAILABLE


# --------------------------------------------------------------------------------------- start-up errors
def serve_command(*flags: str) -> subprocess.CompletedProcess[str]:
    """``workbench serve`` as a process; these must fail before any model loads."""
    command = [sys.executable, "-m", "workbench", "serve", "--port=0", *flags]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env={**os.environ})


@pytest.mark.parametrize(
    ("config", "said"),
    [
        ("server_key: 'unterminated", "Error parsing text-format tensorflow.serving.SSLConfig"),
        ("server_cert: '/etc/ssl/server.pem'", "server_key is missing"),
        ("mismatched", "gRPC cannot use its server_key and server_cert"),
    ],
)
def test_a_bad_ssl_config_file_stops_the_start_with_a_clear_message(
    pki: Pki, repository: Path, tmp_path: Path, config: str, said: str
) -> None:
    path = tmp_path / "ssl.config"
    if config == "mismatched":  # well-formed PEM, but the key of another certificate
        write_ssl_config(path, server_key=pki.client_key.read_text(), server_cert=pki.server_cert.read_text())
    else:
        path.write_text(config)
    done = serve_command(f"--model_repository={repository}", f"--ssl_config_file={path}")
    assert done.returncode == 1, done.stderr
    last = done.stderr.splitlines()[-1]  # gRPC's own log lines may come before
    assert last.startswith("workbench serve: ") and said in last
    assert "Traceback" not in done.stderr


def test_a_missing_rest_key_file_stops_the_start(pki: Pki, repository: Path, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.key"
    done = serve_command(
        f"--model_repository={repository}",
        "--rest_api_port=-1",
        f"--rest_api_ssl_cert_file={pki.server_cert}",
        f"--rest_api_ssl_key_file={missing}",
    )
    assert done.returncode == 1
    assert f"workbench serve: --rest_api_ssl_key_file={missing}: no such file" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"rest_api_ssl_key_file": "k.pem"}, "--rest_api_ssl_key_file was given without --rest_api_ssl_cert_file"),
        ({"rest_api_ssl_client_ca_file": "ca.pem"}, "--rest_api_ssl_client_ca_file was given without"),
    ],
)
def test_rest_tls_flags_need_a_certificate(fields: dict[str, str], said: str) -> None:
    with pytest.raises(ServingError) as refused:
        ServerOptions(**fields).rest_tls()  # type: ignore[arg-type]
    assert said in refused.value.message


def test_a_key_that_is_not_the_certificates_stops_rest(
    serve: Callable[..., ServerThread], pki: Pki, repository: Path
) -> None:
    with pytest.raises(ServingError) as refused:
        serve(
            model_repository=str(repository),
            rest_api_ssl_cert_file=str(pki.server_cert),
            rest_api_ssl_key_file=str(pki.client_key),
        )
    assert "REST TLS cannot use" in refused.value.message and "KEY_VALUES_MISMATCH" in refused.value.message


def test_ssl_config_fields_hold_pem_text_not_file_names(pki: Pki, tmp_path: Path) -> None:
    paths = {"server_key": str(pki.server_key), "server_cert": str(pki.server_cert)}  # a common mistake
    config = write_ssl_config(tmp_path / "paths.config", **paths)
    with pytest.raises(ServingError) as refused:
        parse_ssl_config_file(config)
    assert "server_key is not a PEM private key (the field holds the PEM text itself, not a file name)" in (
        refused.value.message
    )
    with pytest.raises(ServingError) as unreadable:
        parse_ssl_config_file(tmp_path / "absent.config")
    assert unreadable.value.message.startswith(f"Could not read SSL config file {tmp_path / 'absent.config'}")


def test_the_ssl_config_file_flag_is_served_not_refused() -> None:
    from workbench.config.serve_options import serve_options
    from workbench.config.server_flags import UNSUPPORTED_TF_SERVING_FLAGS

    assert "ssl_config_file" not in UNSUPPORTED_TF_SERVING_FLAGS
    options = serve_options(["--model_base_path=/m", "--ssl_config_file=/s.config", "--rest_api_ssl_cert_file=/c"])
    assert (options.ssl_config_file, options.rest_api_ssl_cert_file) == ("/s.config", "/c")


# ------------------------------------------------------------------------------------- Jupyter's proxy
@pytest.fixture
def https_server(runtime_dir: Path, serve: Callable[..., ServerThread], pki: Pki, repository: Path) -> ServerThread:
    return serve(
        model_repository=str(repository),
        rest_api_ssl_cert_file=str(pki.server_cert),
        rest_api_ssl_key_file=str(pki.server_key),
    )


async def test_jupyter_lists_and_proxies_an_https_server(jp_fetch: Any, https_server: ServerThread) -> None:
    (listed,) = json.loads((await jp_fetch("workbench", "api", "servers")).body)["servers"]
    assert listed["tls"] is True and "error" not in listed
    assert [m["name"] for m in listed["models"]] == ["hp"]
    predict = await jp_fetch(
        "workbench",
        "proxy",
        listed["id"],
        "v1/models/hp:predict",
        method="POST",
        body=json.dumps({"instances": [[1.0]]}),
        headers={"Content-Type": "application/json"},
    )
    assert json.loads(predict.body) == {"predictions": [[2.5]]}


async def test_jupyters_proxy_trusts_only_the_recorded_certificate(
    jp_fetch: Any, https_server: ServerThread, pki: Pki, runtime_dir: Path
) -> None:
    # The same server, recorded with another certificate than the one it serves: the pin does not match.
    (path,) = runtime_dir.glob("*.json")
    record = json.loads(path.read_text())
    record.update(id="impostor-1", tls_cert_file=str(pki.client_cert))
    (runtime_dir / "impostor-1.json").write_text(json.dumps(record))
    with pytest.raises(HTTPClientError) as refused:
        await jp_fetch("workbench", "proxy", "impostor-1", "v1/models/hp")
    assert refused.value.code == 502
    servers = json.loads((await jp_fetch("workbench", "api", "servers")).body)["servers"]
    impostor = next(s for s in servers if s["id"] == "impostor-1")
    assert "did not answer" in impostor["error"] and "CERTIFICATE_VERIFY_FAILED" in impostor["error"]


async def test_jupyter_lists_but_does_not_proxy_a_server_requiring_client_certificates(
    jp_fetch: Any, runtime_dir: Path, mtls_server: ServerThread
) -> None:
    (listed,) = json.loads((await jp_fetch("workbench", "api", "servers")).body)["servers"]
    assert listed["tls_client_auth"] is True and listed["proxy_url"] is None
    assert "requires client certificates" in listed["error"]
    with pytest.raises(HTTPClientError) as refused:
        await jp_fetch("workbench", "proxy", listed["id"], "v1/models/hp")
    assert refused.value.code == 404


def test_serve_start_magic_passes_tls_flags_to_the_server(pki: Pki) -> None:
    from workbench.notebook.magics import parse_arguments

    words = [f"--ssl_config_file={pki.ssl_config}", f"--rest_api_ssl_cert_file={pki.server_cert}"]
    args = parse_arguments("start", [*words, f"--rest_api_ssl_key_file={pki.server_key}", f"--ca_file={pki.ca}"])
    handle = ServerHandle(
        "models",
        ssl_config_file=args.ssl_config_file,
        rest_api_ssl_cert_file=args.rest_api_ssl_cert_file,
        rest_api_ssl_key_file=args.rest_api_ssl_key_file,
        ca_file=args.ca_file,
    )
    assert [word for word in handle.command() if "ssl" in word] == [
        f"--ssl_config_file={pki.ssl_config}",
        f"--rest_api_ssl_cert_file={pki.server_cert}",
        f"--rest_api_ssl_key_file={pki.server_key}",
    ]
    assert handle.ca_file == str(pki.ca)
    shutil.rmtree(handle.log_path.parent)  # the handle's folder, made for a server never started here
