"""Kafka security settings are refused when incomplete or contradictory, naming the setting -
at start, before any connection - and every client gets TLS and SASL from them alike."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from pydantic import ValidationError

from worker.connections import kafka_connection
from worker.settings import Settings

SASL = {"kafka_security_protocol": "SASL_SSL", "kafka_sasl_mechanism": "SCRAM-SHA-256",
        "kafka_sasl_username": "u", "kafka_sasl_password": "p-secret"}


@pytest.mark.parametrize("fields, says", [
    ({"kafka_security_protocol": "SASL_SSL"}, "SGW_KAFKA_SASL_MECHANISM, SGW_KAFKA_SASL_USERNAME"),
    ({**SASL, "kafka_sasl_password": ""}, "SGW_KAFKA_SASL_PASSWORD"),
    ({"kafka_sasl_username": "u"}, "SGW_KAFKA_SASL_*"),
    ({"kafka_security_protocol": "SSL", "kafka_ssl_cert_file": "/etc/hostname"}, "go together"),
    ({"kafka_security_protocol": "SSL", "kafka_ssl_ca_file": "/no/such/ca.pem"}, "SGW_KAFKA_SSL_CA_FILE: no file"),
    ({"kafka_ssl_ca_file": "/etc/hostname"}, "SGW_KAFKA_SSL_CA_FILE: set, but"),
])
def test_incomplete_security_is_refused_naming_the_setting(fields: dict[str, str], says: str) -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(**fields)
    assert says in str(refused.value)
    assert "p-secret" not in str(refused.value)


def test_every_client_gets_tls_and_sasl_with_host_names_checked() -> None:
    options = kafka_connection(Settings(**SASL))
    assert options["security_protocol"] == "SASL_SSL" and options["sasl_mechanism"] == "SCRAM-SHA-256"
    assert (options["sasl_plain_username"], options["sasl_plain_password"]) == ("u", "p-secret")
    context = options["ssl_context"]
    assert isinstance(context, ssl.SSLContext) and context.check_hostname
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert "ssl_context" not in kafka_connection(Settings()) and "sasl_mechanism" not in kafka_connection(Settings())


def test_the_sasl_password_is_one_of_the_secrets_cut_from_output(tmp_path: Path) -> None:
    assert "p-secret" in Settings(**SASL).secrets()
