"""The tutorial notebooks' kernels start even when another process took one of their ports first
(tests/notebook_kernels.py), and a kernel that dies of anything else says why."""

from __future__ import annotations

import socket
import sys
from typing import Any

import nbval.kernel
import notebook_kernels
import pytest
from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from jupyter_client.manager import KernelManager

STARTUP_SECONDS = 120  # a kernel's start on a loaded two-core machine


def test_nbval_starts_the_notebooks_kernels_through_the_port_race_guard() -> None:
    assert nbval.kernel.start_new_kernel is notebook_kernels.start_kernel


def test_a_kernel_whose_port_another_process_took_starts_again_on_fresh_ports() -> None:
    managers: list[KernelManager] = []

    with socket.socket() as holder:  # the other process: it took the port between jupyter_client's pick and the bind
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]

        def make_manager(kernel_name: str) -> KernelManager:
            manager = notebook_kernels.nbval_manager(kernel_name)
            if not managers:
                # Without its port cache, jupyter_client keeps a port already set and draws the other four.
                manager.cache_ports = False
                manager.shell_port = taken
            managers.append(manager)
            return manager

        manager, client = notebook_kernels.start_kernel(
            STARTUP_SECONDS, nbval.kernel.CURRENT_ENV_KERNEL_NAME, make_manager=make_manager
        )
    try:
        assert len(managers) == 2
        assert not managers[0].is_alive()
        assert manager is managers[1] and manager.shell_port != taken
        outputs: list[dict[str, Any]] = []
        reply = client.execute_interactive("6 * 7", timeout=STARTUP_SECONDS, output_hook=outputs.append)
        assert reply["content"]["status"] == "ok"
        results = [o["content"]["data"]["text/plain"] for o in outputs if o["msg_type"] == "execute_result"]
        assert results == ["42"]
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


class BrokenKernelSpecs(KernelSpecManager):
    """One kernel, which exits at start with a reason on its stderr."""

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        code = "import sys; sys.exit('this kernel cannot start: a broken environment')"
        argv = [sys.executable, "-c", code, "{connection_file}"]
        return KernelSpec(argv=argv, display_name="broken", language="python")


def test_a_kernel_that_dies_of_anything_else_is_not_started_again_and_its_stderr_says_why() -> None:
    managers: list[KernelManager] = []

    def make_manager(kernel_name: str) -> KernelManager:
        managers.append(KernelManager(kernel_name=kernel_name, kernel_spec_manager=BrokenKernelSpecs()))
        return managers[-1]

    with pytest.raises(RuntimeError, match="Kernel died before replying to kernel_info") as raised:
        notebook_kernels.start_kernel(STARTUP_SECONDS, "broken", make_manager=make_manager)
    assert "this kernel cannot start: a broken environment" in str(raised.value)
    assert len(managers) == 1
