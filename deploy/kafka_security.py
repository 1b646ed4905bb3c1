"""A SASL_SSL listener for the local broker, as managed Kafka offers (the tests of secured Kafka):
a CA and a broker certificate made with openssl, SCRAM-SHA-256/512 users made when the storage
is formatted, and PLAIN users in the listener's configuration. The broker keeps its PLAINTEXT
listener beside it, so a test can set things up and look at topics without credentials."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

NAME = "SECURED"  # the listener's name in the broker's configuration
SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"


@dataclass
class SecuredListener:
    users: dict[str, str] = field(default_factory=lambda: {"alice": "alice-secret-1"})
    port: int = 0
    folder: Path | None = None

    @property
    def ca_file(self) -> Path:
        assert self.folder is not None
        return self.folder / "ca.pem"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def make_certificates(self, folder: Path) -> None:
        """A CA, and the broker's key and certificate (for 127.0.0.1 and localhost) signed by it."""
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

        def openssl(*args: str) -> None:
            done = subprocess.run(["openssl", *args], cwd=folder, capture_output=True, text=True, timeout=60)
            if done.returncode != 0:
                raise RuntimeError(f"openssl {args[0]} failed: {done.stderr}")

        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
                "-days", "2", "-subj", "/CN=scorer-group-worker test CA")
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "broker.key", "-out", "broker.csr",
                "-subj", "/CN=127.0.0.1")
        (folder / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        openssl("x509", "-req", "-in", "broker.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", "broker.crt", "-days", "2", "-extfile", "san.ext")
        # Kafka's PEM key store: the private key (PKCS#8, unencrypted) and the certificate chain.
        (folder / "broker.pem").write_text((folder / "broker.key").read_text() + (folder / "broker.crt").read_text()
                                           + (folder / "ca.pem").read_text())

    def format_arguments(self) -> list[str]:
        """``StorageTool format`` arguments that create the SCRAM users."""
        return [argument for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512") for name, password in self.users.items()
                for argument in ("--add-scram", f"{mechanism}=[name={name},password={password}]")]

    def properties(self) -> list[str]:
        assert self.folder is not None
        prefix = f"listener.name.{NAME.lower()}"
        plain_users = " ".join(f'user_{name}="{password}"' for name, password in self.users.items())
        return [
            f"{prefix}.sasl.enabled.mechanisms=SCRAM-SHA-256,SCRAM-SHA-512,PLAIN",
            *(f"{prefix}.{mechanism}.sasl.jaas.config={SCRAM_MODULE} required;"
              for mechanism in ("scram-sha-256", "scram-sha-512")),
            f"{prefix}.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
            f"{plain_users};",
            f"{prefix}.ssl.keystore.type=PEM",
            f"{prefix}.ssl.keystore.location={self.folder / 'broker.pem'}",
            f"{prefix}.ssl.client.auth=none",
        ]
