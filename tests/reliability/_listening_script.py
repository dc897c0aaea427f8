"""Run by ``gpulayer launch --nproc-per-node 2``: once the ranks have talked, rank 0 writes to OUT (JSON) every TCP
socket that the agent (its parent) and the workers (the agent's other children) listen on, as ``host:port``.

    python -m gpulayer.runtime launch --nproc-per-node 2 _listening_script.py OUT
"""

from __future__ import annotations

import json
import os
import socket
import sys

import torch

from gpulayer.runtime import Runtime
from gpulayer.runtime.testing import descendants


def listening(pid: int) -> list[str]:
    """The ``host:port`` of each TCP socket ``pid`` listens on, read from /proc (Linux)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = []
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        with open(table) as rows:
            for row in list(rows)[1:]:
                fields = row.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    found.append(_address(fields[1], family))
    return found


def _address(text: str, family: int) -> str:
    """``0100007F:93F1`` -> ``127.0.0.1:37873``: /proc prints the address as 32-bit words in host byte order."""
    address, port = text.split(":")
    raw = bytes.fromhex(address)
    raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    host = socket.inet_ntop(family, raw)
    return f"[{host}]:{int(port, 16)}" if family == socket.AF_INET6 else f"{host}:{int(port, 16)}"


def main() -> None:
    with Runtime(accelerator="cpu") as runtime:
        runtime.all_reduce(torch.ones(1))  # every worker has connected to its peer
        if runtime.global_rank == 0:
            agent = os.getppid()
            workers = descendants(agent)
            seen = {"agent": listening(agent), "workers": [address for pid in workers for address in listening(pid)]}
            with open(sys.argv[1], "w") as out:
                json.dump(seen | {"worker_count": len(workers)}, out)
        runtime.barrier()  # rank 1 stays up, its sockets open, while rank 0 looks


if __name__ == "__main__":
    main()
