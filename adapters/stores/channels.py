"""Rules of alert channels that span a save: secret rotation, and the disabled mark the webhook
sender sets."""

from __future__ import annotations

from typing import Any

from adapters.stores.catalog import CatalogStore, Write
from scoring.catalog import CatalogSnapshot, doc_id
from scoring.models import SECRET_ROTATION_OVERLAP_S, AlertChannel, WireModel


def channel_id(channel: AlertChannel) -> str:
    """What identifies a channel everywhere - its catalog id, the key of its lane and breaker in
    the webhook sender, what a 410 disables: ``project|agent|url``, or ``agent|url`` for an
    operator's shared channel. Agent ids are the tenants' own, so two projects (and an operator)
    may each have a channel to the same agent and URL; none of them shares another's state."""
    return doc_id(channel)


def legacy_channel_id(channel: AlertChannel) -> str:
    """The id before the project was part of it, as keys written then have it: open PagerDuty
    incidents (``consumers.webhooks``), needed until those have expired (30 days)."""
    return f"{channel.agent_id}|{channel.url}"


def saved_channel(channel: AlertChannel, stored: WireModel | None, now: float) -> AlertChannel:
    """``channel`` as it is saved over ``stored``.

    A changed secret keeps the one it replaces signing for SECRET_ROTATION_OVERLAP_S, so
    receivers switch without failing a delivery; an unchanged secret keeps a rotation in
    progress, so applying the same file twice changes nothing. A channel the sender disabled
    stays disabled unless the saved document says ``disabled`` itself.
    """
    if not isinstance(stored, AlertChannel):
        return channel
    carried: dict[str, Any] = {}
    if "previous_secret" not in channel.model_fields_set:
        if channel.secret == stored.secret:
            carried.update(previous_secret=stored.previous_secret,
                           previous_secret_until=stored.previous_secret_until)
        elif stored.secret is not None:
            carried.update(previous_secret=stored.secret,
                           previous_secret_until=int(now) + SECRET_ROTATION_OVERLAP_S)
    if "disabled" not in channel.model_fields_set and stored.disabled:
        carried.update(disabled=True, disabled_reason=stored.disabled_reason)
    return channel.model_copy(update=carried) if carried else channel


async def disable_channel(store: CatalogStore, id_: str, reason: str) -> bool:
    """Mark a channel disabled (no more deliveries are made to it); False if it is gone or was
    already disabled."""
    changed: list[bool] = []

    def change(catalog: CatalogSnapshot) -> list[Write]:
        changed.clear()
        channel = catalog.channels.get(id_)
        if channel is None or channel.disabled:
            return []
        changed.append(True)
        return [("channels", id_, channel.model_copy(update={"disabled": True, "disabled_reason": reason[:500]}))]

    await store.write(change)
    return bool(changed)
