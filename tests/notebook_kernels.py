"""The tutorial notebooks' kernels, started past the port race jupyter_client leaves open.

jupyter_client chooses a kernel's five ports by binding port 0 and letting it go; the kernel binds them a second
later, once Python has started. In between, any socket of another process may take one: the ports come from the
ephemeral range every outgoing connection draws from too, and the other pytest-xdist worker opens thousands. The
kernel then exits with ``Address already in use`` (ipykernel retries only ports it chose itself), and nbval reports
"Kernel died before replying to kernel_info" for every cell of the notebook: a fresh clone's CI on a busy machine
lost 01-quickstart so. ``start_kernel`` is nbval's ``start_new_kernel`` with two changes: a kernel that lost that
race is started again on fresh ports, and one that died of anything else says why (nbval sends its stderr to
/dev/null).
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable
from typing import IO, Any

from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager
from nbval.kernel import NbvalKernelspecManager

# What ipykernel prints, in its ZMQError, when a port it was given is taken.
PORT_TAKEN = "Address already in use"
# Each try draws five fresh ports; the race is rare, so two lost in a row are rarer still.
ATTEMPTS = 4
STDERR_SHOWN = 4000  # characters of a dead kernel's stderr quoted in the error

log = logging.getLogger(__name__)


def nbval_manager(kernel_name: str) -> KernelManager:
    """A manager as nbval makes one: its kernel spec manager knows the current environment's kernel."""
    return KernelManager(kernel_name=kernel_name, kernel_spec_manager=NbvalKernelspecManager())


def start_kernel(
    startup_timeout: float = 60,
    kernel_name: str = "python",
    *,
    make_manager: Callable[[str], KernelManager] = nbval_manager,
    **kwargs: Any,
) -> tuple[KernelManager, BlockingKernelClient]:
    """Start a kernel and wait until it answers ``kernel_info``, as nbval does; a kernel whose port was taken
    before it could bind it is started again on new ports (``make_manager`` makes each try's manager)."""
    ignored = kwargs.pop("stderr", None)  # nbval's /dev/null: a dead kernel's stderr is the only account of why
    if ignored is not None:
        ignored.close()
    attempt = 0
    while True:  # a try that lost the port race goes again; the last one, or any other death, raises
        attempt += 1
        with tempfile.TemporaryFile() as stderr:
            manager = make_manager(kernel_name)
            manager.start_kernel(stderr=stderr, **kwargs)
            client = manager.client()
            client.start_channels()
            try:
                client.wait_for_ready(timeout=startup_timeout)
            except RuntimeError as error:
                client.stop_channels()
                manager.shutdown_kernel(now=True)
                said = _read(stderr)
                if PORT_TAKEN in said and attempt < ATTEMPTS:
                    log.warning("a kernel lost a port before it bound it (try %d of %d): again", attempt, ATTEMPTS)
                    continue
                raise RuntimeError(f"{error}; the kernel's stderr:\n{said[-STDERR_SHOWN:]}") from error
            # The kernel holds its own copy of the file; ours closes here, and what it writes later goes unread.
            return manager, client


def _read(stderr: IO[bytes]) -> str:
    stderr.seek(0)
    return stderr.read().decode(errors="replace")
