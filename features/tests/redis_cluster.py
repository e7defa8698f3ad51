"""A real Redis Cluster of three masters on local ports, for the online store's cluster tests.

Each master is a ``redis-server --cluster-enabled yes`` process with its files in a temporary
folder; ``redis-cli --cluster create`` assigns the 16,384 slots. Nothing is persisted.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import redis

from workspaces.testing.waiting import wait_until

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"


def _free_cluster_port() -> int:
    """A port free on 127.0.0.1 whose cluster bus port (port + 10000) is free as well."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if port + 10000 > 65535:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


@contextmanager
def redis_cluster(folder: Path, masters: int = 3) -> Iterator[list[int]]:
    """Start ``masters`` cluster nodes, join them, wait until every node says the cluster is
    ok; yield their ports; stop them."""
    ports: list[int] = []
    processes: list[subprocess.Popen] = []
    try:
        for _ in range(masters):
            port = _free_cluster_port()
            ports.append(port)
            processes.append(
                subprocess.Popen(
                    [
                        *(REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1"),
                        *("--cluster-enabled", "yes"),
                        *("--cluster-config-file", f"nodes-{port}.conf"),
                        *("--save", "", "--appendonly", "no", "--dir", str(folder)),
                        *("--logfile", str(folder / f"redis-{port}.log")),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        clients = [redis.Redis(port=port, socket_timeout=5) for port in ports]
        for client in clients:
            wait_until(
                client.ping, timeout=30, what="a cluster node", retry_on=(redis.ConnectionError,)
            )
        subprocess.run(
            [
                *(REDIS_CLI, "--cluster", "create", *(f"127.0.0.1:{port}" for port in ports)),
                *("--cluster-replicas", "0", "--cluster-yes"),
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        for client in clients:
            wait_until(
                lambda client=client: client.cluster("info")["cluster_state"] == "ok",
                timeout=30,
                what="the cluster's state to be ok on every node",
            )
        yield ports
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            with suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
            if process.poll() is None:
                process.kill()
                process.wait()
