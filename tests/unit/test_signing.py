"""Standard Webhooks signatures, checked with the reference library receivers use
(``standardwebhooks`` from PyPI), and secret rotation on save."""

from __future__ import annotations

import time

import pytest
from pydantic import ValidationError
from standardwebhooks import Webhook, WebhookVerificationError

from adapters.stores.channels import saved_channel
from scorer_groups import signing
from scoring.errors import field_errors
from scoring.models import SECRET_ROTATION_OVERLAP_S, AlertChannel

BODY = b'{"type":"scorer_group.signal","data":{"rating":2.0}}'


def test_a_signed_delivery_verifies_with_the_reference_library() -> None:
    secret = signing.new_secret()
    assert secret.startswith("whsec_")
    now = int(time.time())
    headers = signing.headers("msg-1", now, BODY, [secret])
    assert headers["webhook-id"] == "msg-1" and headers["webhook-timestamp"] == str(now)
    assert Webhook(secret).verify(BODY, headers) == {"type": "scorer_group.signal", "data": {"rating": 2.0}}
    with pytest.raises(WebhookVerificationError):
        Webhook(signing.new_secret()).verify(BODY, headers)
    with pytest.raises(WebhookVerificationError):  # the id is signed: a replay cannot pick a fresh one
        Webhook(secret).verify(BODY, {**headers, "webhook-id": "msg-2"})
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(BODY + b" ", headers)


def test_every_generated_secret_is_new_and_a_valid_key() -> None:
    secrets = {signing.new_secret() for _ in range(50)}
    assert len(secrets) == 50
    assert all(len(signing.secret_key(s)) == signing.SECRET_BYTES for s in secrets)


@pytest.mark.parametrize("bad", ["s3cret", "whsec_not base64!", "whsec_" + "QUJD" * 2])
def test_a_channel_secret_that_is_not_a_whsec_secret_is_refused_at_save(bad: str) -> None:
    with pytest.raises(ValidationError) as info:
        AlertChannel.model_validate({"agentId": "a", "url": "https://hooks.example.com/x", "secret": bad})
    errors = field_errors(info.value)
    assert errors[0].startswith("(document): secret: ")
    assert bad not in " ".join(errors), "the refused secret is not echoed"


def test_a_rotated_secret_keeps_signing_for_the_overlap_then_stops() -> None:
    old, new = signing.new_secret(), signing.new_secret()
    url = "https://hooks.example.com/x"
    stored = AlertChannel.model_validate({"agentId": "a", "url": url, "secret": old})
    now = time.time()
    rotated = saved_channel(AlertChannel.model_validate({"agentId": "a", "url": url, "secret": new}), stored, now)
    assert rotated.previous_secret_until == int(now) + SECRET_ROTATION_OVERLAP_S

    during = signing.headers("msg-9", int(now), BODY, rotated.signing_secrets(now))
    assert len(during["webhook-signature"].split(" ")) == 2
    Webhook(old).verify(BODY, during)  # a receiver not yet switched
    Webhook(new).verify(BODY, during)  # a receiver already switched

    later = now + SECRET_ROTATION_OVERLAP_S + 1
    after = signing.headers("msg-9", int(now), BODY, rotated.signing_secrets(later))
    Webhook(new).verify(BODY, after)
    with pytest.raises(WebhookVerificationError):
        Webhook(old).verify(BODY, after)

    again = saved_channel(AlertChannel.model_validate({"agentId": "a", "url": url, "secret": new}), rotated, now + 5)
    assert again == rotated, "saving the same secret again keeps the rotation as it is"


def test_previous_secret_is_masked_like_the_secret() -> None:
    channel = AlertChannel.model_validate({"agentId": "a", "url": "https://h.example.com", "secret": signing.new_secret(),
                                           "previousSecret": signing.new_secret(), "previousSecretUntil": 1})
    assert channel.wire()["previousSecret"] == "**********" and channel.wire()["secret"] == "**********"
