"""Where running workbench servers record themselves, so that Jupyter can list them and proxy to them.

Every :class:`~workbench.server.ModelServer` (in a ``workbench serve`` process started by a notebook kernel, or
in-process) writes one small JSON file, ``<id>.json``, under Jupyter's runtime directory once it answers, and
removes it when it stops. Jupyter's server extension reads the folder; it never learns a target from a request.

A server killed with SIGKILL cannot remove its file, so readers check that the recorded process still lives
and is still the one that wrote the record (a pid can be reused): stale records are skipped and deleted.

This module imports neither TensorFlow nor Jupyter (``jupyter_core`` only when the runtime directory is asked
for), because the serving process imports it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Any, Protocol

from workbench.runtime.process import pid_exists, write_json_atomically

log = logging.getLogger(__name__)

#: Overrides the folder the records live in (tests; several Jupyter installations side by side).
RUNTIME_DIR_ENV = "WORKBENCH_RUNTIME_DIR"
#: The records' folder inside Jupyter's runtime directory.
SUBDIR = "workbench-servers"
# Ids are file names: nothing that could climb out of the folder or hide a file (they come back in URLs).
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class _Options(Protocol):
    """The :class:`~workbench.config.options.ServerOptions` fields a record is made from."""

    rest_api_host: str
    grpc_host: str
    model_name: str
    model_repository: str
    model_config_file: str
    model_base_path: str
    server_name: str
    management_token: str


@dataclasses.dataclass(frozen=True)
class ServerRecord:
    """One running server, as written to ``<id>.json`` (field names are the JSON keys)."""

    id: str
    pid: int
    name: str
    rest_host: str
    rest_port: int | None  # None: REST is off; the server is listed but cannot be proxied
    grpc_host: str
    grpc_port: int | None
    model_repository: str = ""
    model_config_file: str = ""
    model_base_path: str = ""
    started: float = 0.0  # epoch seconds
    version: str = ""  # workbench's version
    # The process's start time in clock ticks after boot (Linux /proc/<pid>/stat): a reused pid has another.
    process_start: int | None = None
    # Whether management POSTs need a bearer token (the token itself is never written down here).
    token_required: bool = False
    # REST is https (--rest_api_ssl_cert_file): the proxy connects with TLS and trusts exactly this certificate
    tls: bool = False
    tls_cert_file: str = ""
    tls_client_auth: bool = False  # REST requires client certificates, which the proxy has none of
    grpc_tls: bool = False  # gRPC wants a TLS channel (--ssl_config_file)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, doc: object) -> ServerRecord:
        """Parse a record; ``ValueError`` if it is not one (keys a newer version adds are ignored)."""
        if not isinstance(doc, dict):
            raise ValueError("a server record is a JSON object")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        values = {key: value for key, value in doc.items() if key in fields}
        try:
            record = cls(**values)
        except TypeError as exc:  # a required field is missing
            raise ValueError(str(exc)) from None
        _check_types(record)
        return record


def _check_types(record: ServerRecord) -> None:
    def port(value: object) -> bool:
        return value is None or (isinstance(value, int) and not isinstance(value, bool) and 0 < value < 65536)

    if not (isinstance(record.id, str) and _ID.fullmatch(record.id)):
        raise ValueError(f"bad id {record.id!r}")
    if isinstance(record.pid, bool) or not isinstance(record.pid, int) or record.pid <= 0:
        raise ValueError(f"bad pid {record.pid!r}")
    if not (port(record.rest_port) and port(record.grpc_port)):
        raise ValueError("bad port")
    for name in (
        "name", "rest_host", "grpc_host", "model_repository", "model_config_file", "model_base_path", "tls_cert_file"
    ):  # fmt: skip
        if not isinstance(getattr(record, name), str):
            raise ValueError(f"bad {name}")
    for name in ("token_required", "tls", "tls_client_auth", "grpc_tls"):
        if not isinstance(getattr(record, name), bool):
            raise ValueError(f"bad {name}")
    if record.process_start is not None and not isinstance(record.process_start, int):
        raise ValueError("bad process_start")


# ------------------------------------------------------------------------------------------------ paths
def registry_dir() -> Path:
    """The folder of the records: ``$WORKBENCH_RUNTIME_DIR``, else ``<jupyter runtime dir>/workbench-servers``."""
    override = os.environ.get(RUNTIME_DIR_ENV)
    if override:
        return Path(override)
    try:
        from jupyter_core.paths import jupyter_runtime_dir

        runtime = jupyter_runtime_dir()
    except ImportError:  # jupyter_core is not a dependency of the server: find the same folder it would
        runtime = os.environ.get("JUPYTER_RUNTIME_DIR") or str(Path.home() / ".local/share/jupyter/runtime")
    return Path(runtime) / SUBDIR


def is_valid_id(server_id: str) -> bool:
    return bool(_ID.fullmatch(server_id))


def server_name(options: _Options) -> str:
    """A human name for a server: the one it was given, else its repository folder, config file or model."""
    if options.server_name:
        return options.server_name
    if options.model_repository:
        return Path(options.model_repository).resolve().name or "default"
    if options.model_config_file:
        return Path(options.model_config_file).name
    if options.model_base_path:
        return options.model_name or "default"
    return "default"


def make_record(
    options: _Options,
    *,
    rest_port: int | None,
    grpc_port: int | None,
    started: float | None = None,
    pid: int | None = None,
) -> ServerRecord:
    """The record of a server of this process that answers on these ports."""
    from workbench.runtime.version import __version__

    pid = os.getpid() if pid is None else pid
    # Unique on the host: one process may run several servers, but never two on one port.
    server_id = f"{pid}-{rest_port}" if rest_port else f"{pid}-g{grpc_port or 0}"

    def absolute(path: str) -> str:
        return str(Path(path).resolve()) if path and "://" not in path else path

    return ServerRecord(
        id=server_id,
        pid=pid,
        name=server_name(options),
        rest_host=options.rest_api_host,
        rest_port=rest_port or None,
        grpc_host=options.grpc_host,
        grpc_port=grpc_port or None,
        model_repository=absolute(options.model_repository),
        model_config_file=absolute(options.model_config_file),
        model_base_path=absolute(options.model_base_path),
        started=time.time() if started is None else started,
        version=__version__,
        process_start=_process_start(pid),
        token_required=bool(options.management_token),
        # Read with defaults: embedders (Ray Serve's replicas) describe servers with options of their own.
        tls=bool(getattr(options, "rest_api_ssl_cert_file", "")),
        tls_cert_file=absolute(getattr(options, "rest_api_ssl_cert_file", "")),
        tls_client_auth=bool(getattr(options, "rest_api_ssl_client_ca_file", "")),
        grpc_tls=bool(getattr(options, "ssl_config_file", "")),
    )


# ------------------------------------------------------------------------------------ writing, removing
def register(record: ServerRecord) -> Path | None:
    """Write ``record`` atomically; the file's path, or None (logged) if it could not be written.

    Never raises: a read-only home or a full disk must not stop a model server from serving.
    """
    try:
        folder = registry_dir()
        # Private like Jupyter's runtime dir: the records say which local ports serve which models.
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = folder / f"{record.id}.json"
        # Through <id>.json.tmp, which readers' *.json never matches: they never see a half-written record.
        write_json_atomically(path, record.to_json(), mode=0o600, indent=1)
        return path
    except Exception as exc:  # noqa: BLE001 - listing in Jupyter is a convenience, serving is not
        log.warning("Could not record workbench server %s for Jupyter (%s); serving anyway", record.id, exc)
        return None


def register_server(
    options: _Options, rest_port: int | None, grpc_port: int | None, started: float | None = None
) -> str | None:
    """Record a server of this process that now answers; its id, or None (logged) if it was not recorded.

    Never raises: a read-only home or a full disk must not stop a model server from serving.
    """
    try:
        record = make_record(options, rest_port=rest_port, grpc_port=grpc_port, started=started)
    except Exception as exc:  # noqa: BLE001 - see above
        log.warning("Could not describe workbench server for Jupyter (%s); serving anyway", exc)
        return None
    return record.id if register(record) is not None else None


def unregister(server_id: str) -> None:
    """Remove a record (nothing happens if it is not there or cannot be removed)."""
    if not is_valid_id(server_id):
        return
    try:
        (registry_dir() / f"{server_id}.json").unlink(missing_ok=True)
    except Exception as exc:  # noqa: BLE001 - stopping must go on; readers clean stale records anyway
        log.warning("Could not remove the Jupyter record of workbench server %s: %s", server_id, exc)


# ------------------------------------------------------------------------------------------------ reading
def list_servers() -> list[ServerRecord]:
    """The records of servers whose process still lives, oldest first; stale records are deleted."""
    try:
        paths = sorted(registry_dir().glob("*.json"))
    except OSError:
        return []
    records = [record for path in paths if (record := _read_live(path)) is not None]
    return sorted(records, key=lambda r: (r.started, r.id))


def get_server(server_id: str) -> ServerRecord | None:
    """The live record with this id, or None (also for ids that are not valid file names)."""
    if not is_valid_id(server_id):
        return None
    record = _read_live(registry_dir() / f"{server_id}.json")
    return record if record is not None and record.id == server_id else None


def _read_live(path: Path) -> ServerRecord | None:
    try:
        record = ServerRecord.from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        # Possibly a newer workbench's format: leave it alone rather than delete what is not understood.
        log.debug("Ignoring unreadable workbench server record %s: %s", path, exc)
        return None
    if is_live(record):
        return record
    log.info("Removing the stale record of workbench server %s (process %d is gone)", record.id, record.pid)
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)
    return None


def is_live(record: ServerRecord) -> bool:
    """Whether the process that wrote ``record`` still runs (and is not another process with its pid)."""
    if not pid_exists(record.pid):
        return False
    stat = _proc_stat(record.pid)
    if stat is not None and stat[0] in ("Z", "X"):  # killed, not yet reaped by its parent (a kernel)
        return False
    if stat is not None and record.process_start is not None:
        return stat[1] == record.process_start  # exact: same pid and same start time is the same process
    # No start time to compare: a reused pid almost never runs workbench, and `workbench serve` always does.
    cmdline = _cmdline(record.pid)
    return cmdline is None or "workbench" in cmdline


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """State and start time (clock ticks after boot) from ``/proc/<pid>/stat``; None where there is no /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may contain spaces: count fields after the last ")".
    fields = stat[stat.rfind(")") + 2 :].split()
    try:
        return fields[0], int(fields[19])  # fields 3 and 22
    except (IndexError, ValueError):
        return None


def _process_start(pid: int) -> int | None:
    stat = _proc_stat(pid)
    return stat[1] if stat is not None else None


def _cmdline(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
