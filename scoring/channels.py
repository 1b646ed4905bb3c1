"""Rules of alert channels that span a save: secret rotation."""

from __future__ import annotations

from scoring.models import SECRET_ROTATION_OVERLAP_S, AlertChannel, WireModel


def saved_channel(channel: AlertChannel, stored: WireModel | None, now: float) -> AlertChannel:
    """``channel`` as it is saved over ``stored``. A changed secret keeps the one it replaces
    signing for SECRET_ROTATION_OVERLAP_S, so receivers switch without failing a delivery; an
    unchanged secret keeps a rotation in progress, so applying the same file twice changes
    nothing."""
    if not isinstance(stored, AlertChannel) or "previous_secret" in channel.model_fields_set:
        return channel
    if channel.secret == stored.secret:
        carried = {"previous_secret": stored.previous_secret,
                   "previous_secret_until": stored.previous_secret_until}
    elif stored.secret is not None:
        carried = {"previous_secret": stored.secret,
                   "previous_secret_until": int(now) + SECRET_ROTATION_OVERLAP_S}
    else:
        return channel
    return channel.model_copy(update=carried)
