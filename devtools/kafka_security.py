"""A SASL_SSL listener for the local broker, as managed Kafka offers (the tests of secured Kafka):
a CA and a broker certificate (devtools/certificates.py), SCRAM-SHA-256/512 users made when the storage
is formatted, and PLAIN users in the listener's configuration. The broker keeps its PLAINTEXT
listener beside it, so a test can set things up and look at topics without credentials."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from devtools.certificates import Certificates, make_certificates

NAME = "SECURED"  # the listener's name in the broker's configuration
SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"


@dataclass
class SecuredListener:
    users: dict[str, str] = field(default_factory=lambda: {"alice": "alice-secret-1"})
    port: int = 0
    certificates: Certificates | None = None

    @property
    def ca_file(self) -> Path:
        assert self.certificates is not None
        return self.certificates.ca

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def make_certificates(self, folder: Path) -> None:
        self.certificates = make_certificates(folder)

    def format_arguments(self) -> list[str]:
        """``StorageTool format`` arguments that create the SCRAM users."""
        return [argument for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512") for name, password in self.users.items()
                for argument in ("--add-scram", f"{mechanism}=[name={name},password={password}]")]

    def properties(self) -> list[str]:
        assert self.certificates is not None
        prefix = f"listener.name.{NAME.lower()}"
        plain_users = " ".join(f'user_{name}="{password}"' for name, password in self.users.items())
        return [
            f"{prefix}.sasl.enabled.mechanisms=SCRAM-SHA-256,SCRAM-SHA-512,PLAIN",
            *(f"{prefix}.{mechanism}.sasl.jaas.config={SCRAM_MODULE} required;"
              for mechanism in ("scram-sha-256", "scram-sha-512")),
            f"{prefix}.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
            f"{plain_users};",
            f"{prefix}.ssl.keystore.type=PEM",
            f"{prefix}.ssl.keystore.location={self.certificates.pem}",
            f"{prefix}.ssl.client.auth=none",
        ]
