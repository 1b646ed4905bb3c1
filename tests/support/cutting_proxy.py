"""A loopback TCP proxy that cuts a connection at a chosen byte: the fault of a connection lost
mid-pipeline, where the server ran the commands it received whole and the client never hears
their replies.

Armed with ``cut_after(n)``, it forwards the next ``n`` bytes the client sends (on any
connection), then closes the server's side gently - so the server reads and runs every command
those bytes hold - and resets the client's, which sees the connection lost. Disarmed, it
forwards both ways untouched; ``sent`` counts the client's bytes since the last arming.
"""

from __future__ import annotations

import asyncio
import contextlib


class CuttingProxy:
    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._server: asyncio.Server | None = None
        self._cut_at: int | None = None
        self.sent = 0
        self.cuts = 0

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    def cut_after(self, n: int | None) -> None:
        """Cut after the client's next ``n`` bytes (None: never - count them only)."""
        self._cut_at, self.sent = n, 0

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter) -> None:
        try:
            server_in, server_out = await asyncio.open_connection(*self._target)
        except OSError:
            client_out.transport.abort()
            return
        replies = asyncio.create_task(self._pump(server_in, client_out))
        try:
            while chunk := await client_in.read(65_536):
                if self._cut_at is not None and self.sent + len(chunk) >= self._cut_at:
                    server_out.write(chunk[:self._cut_at - self.sent])
                    self.sent, self._cut_at = self._cut_at, None
                    self.cuts += 1
                    await server_out.drain()
                    server_out.close()  # FIN: what arrived is read and run
                    client_out.transport.abort()  # RST: the client hears nothing more
                    break
                self.sent += len(chunk)
                server_out.write(chunk)
                await server_out.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            replies.cancel()
            with contextlib.suppress(BaseException):
                await replies
            for writer in (server_out, client_out):
                with contextlib.suppress(Exception):
                    writer.close()

    @staticmethod
    async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while chunk := await source.read(65_536):
                sink.write(chunk)
                await sink.drain()
