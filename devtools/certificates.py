"""A CA and a server certificate for 127.0.0.1 and localhost, made with openssl for the local
services' TLS listeners (Kafka's SASL_SSL listener, Redis's TLS port) in tests."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Certificates:
    ca: Path  # the CA's certificate: what a client trusts
    cert: Path  # the server's certificate, signed by the CA
    key: Path  # the server's private key (PKCS#8, unencrypted)
    pem: Path  # key, certificate and CA in one file (Kafka's PEM key store)


def make_certificates(folder: Path) -> Certificates:
    folder.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        done = subprocess.run(["openssl", *args], cwd=folder, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"openssl {args[0]} failed: {done.stderr}")

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
            "-days", "2", "-subj", "/CN=scorer-group-worker test CA")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
            "-subj", "/CN=127.0.0.1")
    (folder / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.crt", "-days", "2", "-extfile", "san.ext")
    made = Certificates(ca=folder / "ca.pem", cert=folder / "server.crt", key=folder / "server.key",
                        pem=folder / "server.pem")
    made.pem.write_text(made.key.read_text() + made.cert.read_text() + made.ca.read_text())
    return made
