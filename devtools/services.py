"""Local Apache Kafka for development and tests, on loopback, and the command that starts it with Redis.

``python -m devtools.services run -- COMMAND`` starts Kafka and Redis, runs COMMAND with
``SGW_KAFKA_BOOTSTRAP`` and ``SGW_REDIS_URL`` set, and stops both. The one rule: this module owns how a
broker starts, how we know it is ready, and how it stops. The brokers: docs/design-notes.md.
"""

from __future__ import annotations

import argparse
import atexit
import base64
import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from devtools.kafka_security import NAME as SECURED
from devtools.kafka_security import SecuredListener
from devtools.processes import (
    BIND_ATTEMPTS,
    STOP_TIMEOUT_S,
    PortTaken,
    ServiceError,
    bind_failed,
    free_port,
    on_free_ports,
    port_open,
    read_from,
    stop_process,
    tail,
)
from devtools.redis_servers import LocalRedis, LocalRedisCluster

HERE = Path(__file__).resolve().parent
KAFKA_POM = HERE / "kafka" / "pom.xml"
KAFKA_LIBS = HERE / "kafka" / "target" / "libs"
# Written after a successful resolve; holds the pom's hash so an edited pom resolves again.
KAFKA_LIBS_STAMP = KAFKA_LIBS / ".pom-sha256"

KAFKA_START_TIMEOUT_S = 90.0
# The broker's heap: ample for tests and the demo, small beside a 24 GiB, 2-core machine.
KAFKA_HEAP = ["-Xms256m", "-Xmx1g"]
KAFKA_STARTED_LINE = "Kafka Server started"

LOG4J2_PROPERTIES = """\
status = warn
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {log_file}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.file.ref = FILE
# The one INFO line we keep: it is how we know the broker is ready.
logger.started.name = kafka.server.KafkaRaftServer
logger.started.level = INFO
"""


def ensure_kafka_jars() -> Path:
    """Resolve the broker's jars with Maven unless the current pom's jars are already there."""
    pom_hash = hashlib.sha256(KAFKA_POM.read_bytes()).hexdigest()
    if KAFKA_LIBS_STAMP.exists() and KAFKA_LIBS_STAMP.read_text().strip() == pom_hash:
        return KAFKA_LIBS
    if shutil.which("mvn") is None:
        raise ServiceError("Maven (mvn) is not installed; run devtools/bootstrap.sh first")
    if KAFKA_LIBS.exists():
        shutil.rmtree(KAFKA_LIBS)
    result = subprocess.run(
        ["mvn", "-B", "-q", "-f", str(KAFKA_POM), "dependency:copy-dependencies"],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise ServiceError(f"resolving Kafka's jars failed:\n{result.stdout}\n{result.stderr}")
    KAFKA_LIBS_STAMP.write_text(pom_hash)
    return KAFKA_LIBS


def kafka_version() -> str:
    jars = sorted(KAFKA_LIBS.glob("kafka_2.13-*.jar"))
    return jars[0].stem.removeprefix("kafka_2.13-") if jars else "unknown"


def kafka_cluster_id() -> str:
    """A random cluster id as Kafka writes them: url-safe base64 of a UUID, never starting with
    '-' (the storage tool's argument parser would read such an id as an option - 1 run in 64)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


class LocalKafka:
    """A single-node KRaft Apache Kafka broker on loopback - or, given ``voters``, one node of a
    cluster (``LocalKafkaCluster``)."""

    def __init__(self, partitions: int = 1, *, node_id: int = 1, voters: str = "", replicas: int = 1,
                 heap: list[str] | None = None, secured: SecuredListener | None = None) -> None:
        self.partitions = partitions
        self.secured = secured  # a SASL_SSL listener beside the PLAINTEXT one (devtools/kafka_security.py)
        self.node_id = node_id
        self.voters = voters  # "1@127.0.0.1:port,2@...": a static controller quorum of several nodes
        self.replicas = replicas  # of the internal topics (offsets, transactions)
        self.heap = heap or KAFKA_HEAP
        self.port = 0
        self.bootstrap = ""
        self.controller_port = 0
        self.workdir: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_in_s = 0.0

    def start(self) -> LocalKafka:
        """Start on free ports; if another process took a port between choosing it and the
        broker binding it, start again on new ones."""
        return on_free_ports(self._start_once, self.stop)

    def _start_once(self) -> LocalKafka:
        began = time.monotonic()
        self.prepare(free_port(), free_port(), kafka_cluster_id())
        self._launch()
        self.started_in_s = time.monotonic() - began
        return self

    def prepare(self, port: int, controller_port: int, cluster_id: str) -> None:
        """Choose the ports, write the configuration and format the storage (not started yet)."""
        if shutil.which("java") is None:
            raise ServiceError("Java is not installed; run devtools/bootstrap.sh first")
        ensure_kafka_jars()
        self.workdir = Path(tempfile.mkdtemp(prefix="sgw-kafka-"))
        self.port, self.controller_port = port, controller_port
        self.bootstrap = f"127.0.0.1:{self.port}"
        if self.secured is not None:
            self.secured.port = free_port()
            self.secured.make_certificates(self.workdir / "tls")
        props = self.workdir / "server.properties"
        props.write_text(self._properties(self.controller_port))
        (self.workdir / "log4j2.properties").write_text(LOG4J2_PROPERTIES.format(log_file=self.workdir / "kafka.log"))
        # One node is its own quorum (--standalone); a cluster's nodes name theirs in their
        # configuration (controller.quorum.voters), and share the cluster id.
        quorum = [] if self.voters else ["--standalone"]
        fmt = subprocess.run(
            [*self._java(), "kafka.tools.StorageTool", "format", *quorum, "-t", cluster_id, "-c", str(props),
             *(self.secured.format_arguments() if self.secured else [])],
            capture_output=True, text=True,
        )
        if fmt.returncode != 0:
            raise ServiceError(f"formatting Kafka's storage failed:\n{fmt.stdout}\n{fmt.stderr}")
        atexit.register(self.stop)  # a run that dies without its fixtures' teardown leaves no JVM

    def _java(self) -> list[str]:
        assert self.workdir is not None
        return ["java", *self.heap, f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}",
                "-Dkafka.logs.dir=" + str(self.workdir), "-cp", f"{KAFKA_LIBS}/*"]

    def _launch(self) -> None:
        """Run the broker on the formatted storage in ``workdir`` and wait until it serves."""
        self.wait_started(self.launch())

    def launch(self) -> int:
        """Start the JVM; returns where in its log to look for the line that says it serves."""
        assert self.workdir is not None
        log_file = self.workdir / "kafka.log"
        # A restart appends to the same log: only a "started" line written after this counts.
        seen = log_file.stat().st_size if log_file.exists() else 0
        with open(self.workdir / "kafka.out", "ab") as stdout:
            self.proc = subprocess.Popen(
                [*self._java(), "kafka.Kafka", str(self.workdir / "server.properties")],
                stdout=stdout, stderr=subprocess.STDOUT, start_new_session=True,
            )
        return seen

    def wait_started(self, seen: int) -> None:
        assert self.workdir is not None and self.proc is not None
        log_file = self.workdir / "kafka.log"
        deadline = time.monotonic() + KAFKA_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                output = f"{tail(log_file)}\n{tail(self.workdir / 'kafka.out')}"
                error = PortTaken if bind_failed(output) else ServiceError
                raise error(f"Kafka exited with {self.proc.returncode}:\n{output}")
            if log_file.exists() and KAFKA_STARTED_LINE in read_from(log_file, seen):
                if port_open(self.port):
                    return
            time.sleep(0.1)
        self.stop()
        raise ServiceError(f"Kafka did not start in {KAFKA_START_TIMEOUT_S:.0f}s")

    def kill(self) -> None:
        """SIGKILL the broker, as a crash would (no clean shutdown, logs not closed). Its ports,
        configuration and data stay, for ``restart``."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=STOP_TIMEOUT_S)

    def restart(self) -> LocalKafka:
        """Start the broker again (killing it first if it still runs) on the same ports, cluster
        id and data directory, nothing formatted again: what clients see when a broker comes
        back. Clients know these ports, so one another process took meanwhile is not replaced:
        the restart waits for it a little, then fails."""
        if self.workdir is None:
            raise ServiceError("restart needs a broker that was started (and not stopped)")
        self.kill()
        began = time.monotonic()
        for attempt in range(BIND_ATTEMPTS):
            try:
                self._launch()
                break
            except PortTaken:
                if attempt == BIND_ATTEMPTS - 1:
                    raise
                time.sleep(1.0)  # a socket of the killed broker may linger briefly
        self.started_in_s = time.monotonic() - began
        return self

    def _properties(self, controller_port: int) -> str:
        assert self.workdir is not None
        secured = f",{SECURED}://127.0.0.1:{self.secured.port}" if self.secured else ""
        secured_map = f",{SECURED}:SASL_SSL" if self.secured else ""
        return "\n".join([
            "process.roles=broker,controller",
            f"node.id={self.node_id}",
            (f"controller.quorum.voters={self.voters}" if self.voters
             else f"controller.quorum.bootstrap.servers=127.0.0.1:{controller_port}"),
            f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{controller_port}{secured}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}{secured}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            f"listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT{secured_map}",
            *(self.secured.properties() if self.secured else []),
            f"log.dirs={self.workdir / 'data'}",
            f"num.partitions={self.partitions}",
            # One node: every internal topic has a single replica; a cluster's have ``replicas``.
            f"offsets.topic.replication.factor={self.replicas}",
            "offsets.topic.num.partitions=8",
            f"transaction.state.log.replication.factor={self.replicas}",
            f"transaction.state.log.min.isr={min(2, self.replicas)}",
            f"share.coordinator.state.topic.replication.factor={self.replicas}",
            f"share.coordinator.state.topic.min.isr={min(2, self.replicas)}",
            f"default.replication.factor={self.replicas}",
            # Tests join and leave groups all the time; waiting 3 s for stragglers only slows them.
            "group.initial.rebalance.delay.ms=0",
            "auto.create.topics.enable=true",
            "",
        ])

    def memory_rss_mib(self) -> float:
        """Resident memory of the broker's JVM (Linux), for the foundation report."""
        if self.proc is None:
            return 0.0
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def stop(self) -> None:
        stop_process(self.proc)
        self.proc = None
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None


# A cluster runs three JVMs on the machine's two cores: small heaps.
CLUSTER_HEAP = ["-Xms128m", "-Xmx512m"]


class LocalKafkaCluster:
    """Three KRaft nodes on loopback, each broker and controller in one JVM: a replicated cluster
    (internal topics with 3 replicas, 2 in sync), where a broker can crash (``kill``) and come
    back (``restart``) under load."""

    def __init__(self, nodes: int = 3, partitions: int = 1) -> None:
        self.nodes = [LocalKafka(partitions, node_id=i + 1, replicas=nodes, heap=CLUSTER_HEAP)
                      for i in range(nodes)]
        self.bootstrap = ""
        self.started_in_s = 0.0

    def start(self) -> LocalKafkaCluster:
        return on_free_ports(self._start_once, self.stop)

    def _start_once(self) -> LocalKafkaCluster:
        began = time.monotonic()
        ports = [(free_port(), free_port()) for _ in self.nodes]
        voters = ",".join(f"{n.node_id}@127.0.0.1:{controller}" for n, (_, controller) in zip(self.nodes, ports,
                                                                                              strict=True))
        cluster_id = kafka_cluster_id()
        for node, (port, controller) in zip(self.nodes, ports, strict=True):
            node.voters = voters
            node.prepare(port, controller, cluster_id)
        # All at once: a node serves only once a quorum of controllers has elected a leader.
        seen = [node.launch() for node in self.nodes]
        for node, offset in zip(self.nodes, seen, strict=True):
            node.wait_started(offset)
        self.bootstrap = ",".join(node.bootstrap for node in self.nodes)
        self.started_in_s = time.monotonic() - began
        return self

    def node(self, node_id: int) -> LocalKafka:
        return next(n for n in self.nodes if n.node_id == node_id)

    def kill(self, node_id: int) -> None:
        self.node(node_id).kill()

    def restart(self, node_id: int) -> None:
        self.node(node_id).restart()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


def _run(command: list[str], kafka_nodes: int = 1, redis_cluster: bool = False) -> int:
    """Start both services, run ``command`` with their addresses in the environment, stop."""
    redis: LocalRedis | LocalRedisCluster = LocalRedisCluster() if redis_cluster else LocalRedis()
    redis.start()
    kafka: LocalKafka | LocalKafkaCluster = (LocalKafka(partitions=6) if kafka_nodes == 1
                                             else LocalKafkaCluster(kafka_nodes, partitions=6)).start()
    print(
        f"local services: Kafka {kafka_version()} at {kafka.bootstrap} ({kafka_nodes} node(s), "
        f"started in {kafka.started_in_s:.1f}s), Redis{' Cluster' if redis_cluster else ''} at {redis.url}",
        file=sys.stderr, flush=True,
    )
    env = {**os.environ, "SGW_KAFKA_BOOTSTRAP": kafka.bootstrap, "SGW_REDIS_URL": redis.url,
           "SGW_REDIS_CLUSTER": "true" if redis_cluster else "false"}
    child = subprocess.Popen(command, env=env)
    # Ctrl-C and SIGTERM go to the command first; the services stop after it has exited.
    signal.signal(signal.SIGINT, lambda *_: child.send_signal(signal.SIGINT))
    signal.signal(signal.SIGTERM, lambda *_: child.send_signal(signal.SIGTERM))
    try:
        return child.wait()
    finally:
        kafka.stop()
        redis.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.services", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("jars", help="resolve Kafka's jars from Maven Central")
    run = sub.add_parser("run", help="start Kafka and Redis, run COMMAND, stop them")
    run.add_argument("--kafka-nodes", type=int, choices=(1, 3), default=1,
                     help="one broker, or a replicated cluster of three (KRaft, loopback)")
    run.add_argument("--redis-cluster", action="store_true",
                     help="a Redis Cluster (3 primaries, a replica each) instead of one server")
    run.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.action == "jars":
        print(ensure_kafka_jars())
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("run needs a COMMAND")
    return _run(command, args.kafka_nodes, args.redis_cluster)


if __name__ == "__main__":
    sys.exit(main())
