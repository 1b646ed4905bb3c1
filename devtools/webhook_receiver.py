"""A local webhook receiver for the demo: what an alert channel's owner runs, on loopback.

It verifies every delivery the way docs/deliveries.md tells receivers to (Standard Webhooks 1.0, with
the reference ``standardwebhooks`` library: signature and timestamp), answers 204 when it
verifies (400 when it does not), and prints one line per delivery, so a newcomer sees alerts
arrive signed. Channels without a secret are accepted unsigned and say so.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

from standardwebhooks import Webhook, WebhookVerificationError

from devtools.local_http import LocalHttpServer, QuietHandler


class WebhookReceiver(LocalHttpServer):
    """Serves ``POST /<name>`` on 127.0.0.1; ``secrets`` maps a name to its channel's whsec_
    secret (or None for an unsigned channel). It binds a free port when made; ``start()`` serves."""

    def __init__(self, secrets: dict[str, str | None], say: Callable[[str], None] = print) -> None:
        self.verified: list[dict[str, Any]] = []
        self.rejected: list[str] = []
        self._hooks = {name: Webhook(secret) if secret else None for name, secret in secrets.items()}
        self._say = say
        self._lock = threading.Lock()
        outer = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                body = self.read_body()
                status = outer._receive(self.path.strip("/"), body, {k.lower(): v for k, v in self.headers.items()})
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

        super().__init__(Handler, poll_interval_s=0.1)

    def channel_url(self, name: str) -> str:
        return f"{self.url}/{name}"

    def _receive(self, name: str, body: bytes, headers: dict[str, str]) -> int:
        if name not in self._hooks:
            self._say(f"RECEIVER 404 unknown channel {name!r}")
            return 404
        hook = self._hooks[name]
        try:
            event = hook.verify(body, headers) if hook is not None else json.loads(body)
        except (WebhookVerificationError, ValueError) as exc:
            with self._lock:
                self.rejected.append(name)
            self._say(f"RECEIVER rejected {name}: {exc}")
            return 400
        with self._lock:
            self.verified.append(event)
        how = "signature verified" if hook is not None else "unsigned channel"
        data = event.get("data", event) if isinstance(event, dict) else {}
        self._say(f"RECEIVED {name} ({how}) {headers.get('webhook-id', '')}: {data.get('groupId', '?')} "
                  f"rating {data.get('rating', '?')} < {data.get('alertThreshold', '?')}")
        return 204
