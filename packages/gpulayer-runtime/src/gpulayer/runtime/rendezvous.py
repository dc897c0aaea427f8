"""A single-node rendezvous that listens on loopback only, at a port the operating system chose."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

from torch.distributed import TCPStore

LOOPBACK = "127.0.0.1"


def loopback_interface() -> str | None:
    """The loopback network interface's name (``lo`` on Linux, ``lo0`` on macOS), for ``GLOO_SOCKET_IFNAME``:
    without it gloo listens on the address the host name resolves to, often one the network reaches."""
    names = {name for _, name in socket.if_nameindex()}
    return next((name for name in ("lo", "lo0") if name in names), None)


@contextmanager
def loopback_store(timeout: timedelta) -> Iterator[str]:
    """Host a TCPStore on 127.0.0.1 and yield its ``host:port`` endpoint.

    The store takes over a socket bound to port 0 and never closed, so no other process can take the
    port between choosing and listening. The store is multi-tenant: torch's static rendezvous, asked for
    a store at the same port in this process, reuses this one instead of listening on every interface.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((LOOPBACK, 0))
        sock.listen()
        port = sock.getsockname()[1]
    except OSError:
        sock.close()
        raise
    store = TCPStore(
        LOOPBACK,
        port,
        is_master=True,
        timeout=timeout,
        wait_for_workers=False,
        multi_tenant=True,
        master_listen_fd=sock.detach(),  # the store owns and closes the socket from here on
    )
    try:
        yield f"{LOOPBACK}:{store.port}"
    finally:
        del store
