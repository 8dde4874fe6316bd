"""The HTTP health endpoints of one consumer process: ``/metrics``, ``/healthz`` and ``/readyz``.

``HealthServer`` is a minimal asyncio HTTP/1.1 server for the metrics port: ``GET /metrics``
(Prometheus text format 0.0.4), ``GET /healthz`` (liveness: the runner's loop called
``heartbeat()`` within ``stale_after_s``) and ``GET /readyz`` (readiness: every served queue
connected and consuming, none waiting for a queue that was deleted — 503 naming it while one is —
and the handler threads not exhausted by stuck calls). Every response closes the
connection. Requests are read under a deadline with bounded line and header sizes, so a slow or
hostile client cannot hold the loop or the memory.

With ``--processes N`` each worker process has its own registry; only one process can listen on a
given port, so whoever wires the supervisor decides which process serves it (or gives each worker
its own port).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
from typing import Final

from rmqkit.consumer.metrics import METRICS_CONTENT_TYPE, ConsumerMetrics
from rmqkit.errors import ConfigError

log = logging.getLogger(__name__)


_REASONS: Final = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}
_TEXT: Final = "text/plain; charset=utf-8"
_PATHS: Final = frozenset({"/metrics", "/healthz", "/readyz"})


class _BadRequest(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


class HealthServer:
    """``/metrics``, ``/healthz`` and ``/readyz`` over HTTP/1.1 on ``host``:``port``.

    ``port=0`` picks a free port; ``port`` then gives the bound one after ``start()``. A port
    already in use (or any other failure to listen) raises ``ConfigError`` with one line.

    Limits: the request line and headers must arrive within ``read_timeout_s`` (else 408), one
    line may not exceed ``max_line_bytes`` and all headers together ``max_header_bytes`` (else
    431/400); beyond ``max_connections`` concurrent connections new ones get a 503 at once.
    """

    def __init__(
        self,
        metrics: ConsumerMetrics,
        host: str = "0.0.0.0",
        port: int = 9100,
        *,
        stale_after_s: float = 30.0,
        read_timeout_s: float = 5.0,
        max_line_bytes: int = 4096,
        max_header_bytes: int = 16384,
        max_connections: int = 64,
    ) -> None:
        self.metrics = metrics
        self.host = host
        self._port = port
        self.stale_after_s = stale_after_s
        self.read_timeout_s = read_timeout_s
        self.max_line_bytes = max_line_bytes
        self.max_header_bytes = max_header_bytes
        self.max_connections = max_connections
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        """The bound port once started (useful with port 0), else the configured one."""
        if self._server is not None and self._server.sockets:
            return int(self._server.sockets[0].getsockname()[1])
        return self._port

    @property
    def started(self) -> bool:
        return self._server is not None

    async def start(self) -> None:
        if self._server is not None:
            return
        try:
            self._server = await asyncio.start_server(
                self._on_connection, self.host, self._port, limit=self.max_line_bytes
            )
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ConfigError(
                    f"metrics port {self._port} is in use — pick another with --metrics-port"
                ) from None
            detail = exc.strerror or str(exc)
            raise ConfigError(
                f"cannot listen on {self.host}:{self._port} for metrics: {detail} — "
                "check --metrics-port"
            ) from None
        log.debug("health server listening on %s:%d", self.host, self.port)

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.gather(*self._connections, return_exceptions=True)
        await server.wait_closed()

    async def __aenter__(self) -> HealthServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # --- one connection ---------------------------------------------------------------------

    async def _on_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            if len(self._connections) > self.max_connections:
                await self._respond(writer, 503, "too many connections\n", head=False)
                return
            await self._serve(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away; nothing to answer
        except asyncio.CancelledError:
            # stop() (or asyncio.run's shutdown) cancelled this connection. Nothing awaits these
            # tasks for their result, and Python 3.11's start_server callback logs a cancelled
            # task as an error, so end quietly.
            pass
        except Exception:
            log.exception("health server: unexpected error while answering a request")
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), self.read_timeout_s)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(self.read_timeout_s):
                method, path = await self._read_request(reader)
        except TimeoutError:
            await self._respond(writer, 408, "request not received in time\n", head=False)
            return
        except _BadRequest as exc:
            await self._respond(writer, exc.status, exc.detail + "\n", head=False)
            return

        head = method == "HEAD"
        if path not in _PATHS:
            await self._respond(writer, 404, "not found\n", head=head)
        elif method not in ("GET", "HEAD"):
            await self._respond(writer, 405, "method not allowed\n", head=False, allow=True)
        elif path == "/metrics":
            body = self.metrics.render()
            await self._respond(writer, 200, body, head=head, content_type=METRICS_CONTENT_TYPE)
        elif path == "/healthz":
            age = self.metrics.heartbeat_age()
            if age <= self.stale_after_s:
                await self._respond(writer, 200, "ok\n", head=head)
            else:
                detail = (
                    f"stale: the consumer loop's last heartbeat was {age:.1f}s ago "
                    f"(limit {self.stale_after_s:g}s)\n"
                )
                await self._respond(writer, 503, detail, head=head)
        else:  # /readyz
            reason = self.metrics.not_ready_reason()
            if reason is None:
                await self._respond(writer, 200, "ready\n", head=head)
            else:
                await self._respond(writer, 503, f"not ready: {reason}\n", head=head)

    async def _read_request(self, reader: asyncio.StreamReader) -> tuple[str, str]:
        """Read the request line and headers; return (method, path without query)."""
        line = await self._read_line(reader)
        try:
            text = line.decode("ascii").rstrip("\r\n")
        except UnicodeDecodeError:
            raise _BadRequest(400, "request line is not ASCII") from None
        parts = text.split(" ")
        if len(parts) != 3 or not all(parts):
            raise _BadRequest(400, "malformed request line")
        method, target, version = parts
        if not version.startswith("HTTP/1.") or not method.isalpha() or not method.isupper():
            raise _BadRequest(400, "malformed request line")
        if not target.startswith("/"):
            raise _BadRequest(400, "request target must be a path")

        # Headers are read (to honour the size limits) and ignored: nothing here depends on them,
        # and the connection is closed after the response so any body is never read.
        total = 0
        while True:
            header = await self._read_line(reader)
            if header in (b"\r\n", b"\n"):
                break
            total += len(header)
            if total > self.max_header_bytes:
                raise _BadRequest(431, "request headers too large")
        return method, target.split("?", 1)[0]

    async def _read_line(self, reader: asyncio.StreamReader) -> bytes:
        try:
            return await reader.readuntil(b"\n")
        except asyncio.LimitOverrunError:
            raise _BadRequest(431, "request line or header too long") from None
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                raise _BadRequest(400, "incomplete request") from None
            raise

    async def _respond(
        self,
        writer: asyncio.StreamWriter,
        status: int,
        body: bytes | str,
        *,
        head: bool,
        content_type: str = _TEXT,
        allow: bool = False,
    ) -> None:
        data = body.encode() if isinstance(body, str) else body
        lines = [
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}",
            f"Content-Type: {content_type}",
            f"Content-Length: {len(data)}",
            "Cache-Control: no-store",
            "Connection: close",
        ]
        if allow:
            lines.append("Allow: GET, HEAD")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("ascii"))
        if not head:
            writer.write(data)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(writer.drain(), self.read_timeout_s)


__all__ = ["HealthServer", "heartbeat"]


async def heartbeat(metrics: ConsumerMetrics) -> None:
    """Beat once a second until cancelled: /healthz reads the age of the last beat, so a
    blocked event loop shows as unhealthy."""
    with contextlib.suppress(asyncio.CancelledError):
        while True:
            metrics.heartbeat()
            await asyncio.sleep(1.0)
