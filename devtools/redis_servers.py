"""Local Redis on loopback, for development and tests: one server (``LocalRedis``), or a Redis
Cluster of three primaries, each with a replica (``LocalRedisCluster``), as production runs one
(or a managed one: ElastiCache / Memorystore in cluster mode).

Both are Debian's ``redis-server`` with persistence off, on free ports, with their data in a
temporary folder removed on stop. A server can crash on purpose and come back (``kill`` then
``restart``: same port, same folder). A cluster's nodes are joined by ``redis-cli --cluster
create``; when a primary crashes (``kill_primary_of``) its replica notices within
``NODE_TIMEOUT_MS`` and is promoted, and the crashed node later ``restart``s as a replica of the
promoted one (same port, same node id).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from redis import Redis
from redis.exceptions import RedisError

from devtools.certificates import Certificates, make_certificates
from devtools.processes import (
    STOP_TIMEOUT_S,
    PortTaken,
    ServiceError,
    bind_failed,
    free_port,
    on_free_ports,
    stop_process,
    tail,
)

REDIS_START_TIMEOUT_S = 15.0


@dataclass
class RedisTls:
    """TLS on the server's port and an ACL user in place of the default one, as managed Redis
    offers (in-transit encryption, ACL users): the URL is then ``rediss://user:password@...``."""

    user: str = "scorer"
    password: str = "scorer-redis-secret-4d1e"
    certificates: Certificates | None = None

    def server_arguments(self, port: int, cluster: bool = False) -> list[str]:
        assert self.certificates is not None
        # A cluster's nodes talk TLS to each other too, and replicas sign in as the user.
        links = ["--tls-cluster", "yes", "--tls-replication", "yes", "--masteruser", self.user,
                 "--masterauth", self.password] if cluster else []
        return ["--port", "0", "--tls-port", str(port), "--tls-cert-file", str(self.certificates.cert),
                "--tls-key-file", str(self.certificates.key), "--tls-ca-cert-file", str(self.certificates.ca),
                "--tls-auth-clients", "no", "--user", "default", "off",
                "--user", self.user, "on", f">{self.password}", "~*", "&*", "+@all", *links]

    def cli_arguments(self) -> list[str]:
        assert self.certificates is not None
        return ["--tls", "--cacert", str(self.certificates.ca), "--user", self.user, "--pass", self.password]

    def client_options(self) -> dict[str, object]:
        assert self.certificates is not None
        return {"ssl": True, "ssl_ca_certs": str(self.certificates.ca), "username": self.user,
                "password": self.password}


class LocalRedis:
    """Debian's redis-server on loopback, no persistence. ``cluster_args``: a Redis Cluster node's
    options (``devtools.redis_servers``); its cluster bus then takes a free port of its own.
    ``tls``: TLS and an ACL user (a single server)."""

    def __init__(self, cluster_args: tuple[str, ...] = (), tls: RedisTls | None = None) -> None:
        self.cluster_args = cluster_args
        self.tls = tls
        self.bus_port = 0
        self.port = 0
        self.url = ""
        self.workdir: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> LocalRedis:
        """Start on a free port, again on another if that one was taken before Redis bound it."""
        return on_free_ports(self._start_once, self.stop)

    def _start_once(self) -> LocalRedis:
        self.workdir = Path(tempfile.mkdtemp(prefix="sgw-redis-"))
        self.port = free_port()
        self.bus_port = free_port() if self.cluster_args else 0
        self.url = f"redis://127.0.0.1:{self.port}/0"
        if self.tls is not None:
            if self.tls.certificates is None:  # a cluster's nodes share one CA and certificate
                self.tls.certificates = make_certificates(self.workdir / "tls")
            self.url = f"rediss://{self.tls.user}:{self.tls.password}@127.0.0.1:{self.port}/0"
        atexit.register(self.stop)
        return self._launch()

    def _launch(self) -> LocalRedis:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        if not Path(binary).exists():
            raise ServiceError("redis-server is not installed; run devtools/bootstrap.sh first")
        assert self.workdir is not None
        listen = (self.tls.server_arguments(self.port, cluster=bool(self.cluster_args)) if self.tls
                  else ["--port", str(self.port)])
        self.proc = subprocess.Popen(
            [binary, *listen, "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir), "--loglevel", "warning",
             "--logfile", str(self.workdir / "redis.log"), *self._cluster_options()],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True,
        )
        deadline = time.monotonic() + REDIS_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                output = tail(self.workdir / "redis.log")
                raise (PortTaken if bind_failed(output) else ServiceError)(f"redis-server exited:\n{output}")
            if self._ping():
                return self
            time.sleep(0.05)
        self.stop()
        raise ServiceError(f"redis-server did not answer PING in {REDIS_START_TIMEOUT_S:.0f}s")

    def _cluster_options(self) -> list[str]:
        # The bus port is chosen, not Redis's port + 10000: free ports run past 55535.
        return [*self.cluster_args, "--cluster-port", str(self.bus_port)] if self.cluster_args else []

    def kill(self) -> None:
        """SIGKILL, as a crash: the folder stays, so ``restart`` comes back as the same node."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=STOP_TIMEOUT_S)
            self.proc = None

    def restart(self) -> LocalRedis:
        """Start again on the same port and folder (a cluster node keeps its id and config)."""
        return self._launch()

    def client(self, timeout_s: float = 1.0) -> Redis:
        """A client of this node alone (TLS and the ACL user when the node has them)."""
        options = self.tls.client_options() if self.tls else {}
        return Redis(port=self.port, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                     **options)  # type: ignore[arg-type]

    def _ping(self) -> bool:
        if self.tls is not None:
            try:
                with self.client(0.5) as client:
                    return bool(client.ping())
            except RedisError:
                return False
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        stop_process(self.proc)
        self.proc = None
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None


# How long a primary may not answer before its replica takes over: a few seconds, so a failover
# test is quick, and long enough that a busy 2-core machine does not fail over by mistake.
NODE_TIMEOUT_MS = 3_000
READY_TIMEOUT_S = 30.0


def _node_args() -> tuple[str, ...]:
    return ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
            # A replica promotes itself whatever its lag: on loopback the lag is nothing.
            "--cluster-replica-validity-factor", "0")


class LocalRedisCluster:
    def __init__(self, primaries: int = 3, replicas_each: int = 1, tls: RedisTls | None = None) -> None:
        self.tls = tls
        self.nodes = [LocalRedis(cluster_args=_node_args(), tls=tls) for _ in range(primaries * (1 + replicas_each))]
        self.replicas_each = replicas_each
        self.url = ""
        self.started_in_s = 0.0

    def start(self) -> LocalRedisCluster:
        began = time.monotonic()
        try:
            for node in self.nodes:
                node.start()
            cli = shutil.which("redis-cli") or "/usr/bin/redis-cli"
            created = subprocess.run(
                [cli, *(self.tls.cli_arguments() if self.tls else []),
                 "--cluster", "create", *(f"127.0.0.1:{node.port}" for node in self.nodes),
                 "--cluster-replicas", str(self.replicas_each), "--cluster-yes"],
                capture_output=True, text=True, timeout=60)
            if created.returncode != 0:
                raise ServiceError(f"redis-cli --cluster create failed:\n{created.stdout}{created.stderr}")
            self.url = self.nodes[0].url
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        self.started_in_s = time.monotonic() - began
        return self

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Until every running node says the cluster is ``ok`` (every slot served) and every
        replica has synced with its primary: a failover then loses no acknowledged write older
        than the replication lag."""
        deadline = time.monotonic() + timeout_s
        replicas = len(self.nodes) * self.replicas_each // (1 + self.replicas_each)
        while time.monotonic() < deadline:
            running = [node for node in self.nodes if node.proc is not None]
            synced = sum(_info(node, "replication").get("master_link_status") == "up" for node in running)
            down = len(self.nodes) - len(running)
            if all(_state(node) == "ok" for node in running) and synced >= replicas - down:
                return
            time.sleep(0.1)
        raise ServiceError(f"the Redis Cluster was not ready in {timeout_s:.0f}s")

    def primaries(self) -> list[LocalRedis]:
        return [node for node in self.nodes if node.proc is not None and _role(node) == "master"]

    def primary_of(self, key: str) -> LocalRedis:
        """The node that serves ``key``'s slot now."""
        with self.primaries()[0].client() as client:
            slot = client.cluster("keyslot", key)
            for first, last, (_host, port, *_), *_ in client.cluster("slots"):
                if first <= slot <= last:
                    return next(node for node in self.nodes if node.port == port)
        raise ServiceError(f"no node serves the slot of {key!r}")

    def kill_primary_of(self, key: str) -> LocalRedis:
        """SIGKILL the primary serving ``key``: its replica is promoted after ``NODE_TIMEOUT_MS``."""
        node = self.primary_of(key)
        node.kill()
        return node

    def wait_promoted(self, key: str, killed: LocalRedis, timeout_s: float = READY_TIMEOUT_S) -> float:
        """Until another node serves ``key`` and the cluster is ok again; the seconds it took."""
        began = time.monotonic()
        while time.monotonic() - began < timeout_s:
            with contextlib.suppress(RedisError, ServiceError, StopIteration):
                if self.primary_of(key) is not killed:
                    self.wait_ready(timeout_s - (time.monotonic() - began))
                    return time.monotonic() - began
            time.sleep(0.1)
        raise ServiceError(f"no replica took over from port {killed.port} in {timeout_s:.0f}s")

    def restart(self, node: LocalRedis) -> None:
        """A killed node comes back, and rejoins as a replica of the one promoted in its place."""
        node.restart()

    def flush(self) -> None:
        """Empty every primary (the replicas follow)."""
        for node in self.primaries():
            with node.client(5) as client:
                client.flushall()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


def _info(node: LocalRedis, section: str) -> dict[str, str]:
    try:
        with node.client() as client:
            text = client.execute_command(section) if section == "CLUSTER INFO" else client.info(section)
    except RedisError:
        return {}
    if isinstance(text, dict):
        return {str(k): str(v) for k, v in text.items()}
    if isinstance(text, bytes):
        text = text.decode()
    return dict(line.split(":", 1) for line in str(text).splitlines() if ":" in line)


def _state(node: LocalRedis) -> str:
    return _info(node, "CLUSTER INFO").get("cluster_state", "")


def _role(node: LocalRedis) -> str:
    return _info(node, "replication").get("role", "")
