"""How a client checks a TLS server and proves itself to one, in the forms requests, asyncio and gRPC take."""

from __future__ import annotations

import dataclasses
import ssl
from pathlib import Path
from typing import Any


@dataclasses.dataclass(frozen=True)
class ClientTLS:
    """How a client checks a TLS server, and proves itself to one that checks clients (mutual TLS).

    ``ca_file``: the PEM certificates the server's must chain to; None trusts what each library trusts by default
    (the system's store for asyncio, certifi's or ``$REQUESTS_CA_BUNDLE`` for requests, gRPC's bundled roots or
    ``$GRPC_DEFAULT_SSL_ROOTS_FILE_PATH`` for gRPC). ``cert_file`` and ``key_file`` (PEM): the client's certificate
    and key, for servers that require one (``client_verify``, ``--rest_api_ssl_client_ca_file``); the key may be in
    ``cert_file``.
    """

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def __post_init__(self) -> None:
        if self.key_file and not self.cert_file:
            raise ValueError("a client key_file needs its cert_file")

    def requests_options(self) -> dict[str, Any]:
        """``verify=`` and ``cert=`` for requests."""
        options: dict[str, Any] = {"verify": self.ca_file or True}
        if self.cert_file:
            options["cert"] = (self.cert_file, self.key_file) if self.key_file else self.cert_file
        return options

    def ssl_context(self) -> ssl.SSLContext:
        """A client SSL context (asyncio streams, tornado): the server's certificate and name are checked."""
        context = ssl.create_default_context(cafile=self.ca_file)
        if self.cert_file:
            context.load_cert_chain(self.cert_file, self.key_file)
        return context

    def grpc_credentials(self) -> Any:
        """``grpc.ChannelCredentials`` for ``grpc.secure_channel``."""
        import grpc

        def read(path: str | None) -> bytes | None:
            return Path(path).read_bytes() if path else None

        key = read(self.key_file) or read(self.cert_file)  # a key in the certificate's file: gRPC finds it there
        return grpc.ssl_channel_credentials(
            root_certificates=read(self.ca_file),
            private_key=key if self.cert_file else None,
            certificate_chain=read(self.cert_file),
        )
