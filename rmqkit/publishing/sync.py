"""``rmqkit.SyncPublisher``: ``rmqkit.Publisher`` for synchronous code (WSGI, Django, scripts).

It runs its own event loop in a daemon thread and the Publisher on it; every call hands a
coroutine to that loop and waits for its result, so any number of threads may call it at once
(their messages share the one connection and its confirm window).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterable
from concurrent.futures import Future
from types import TracebackType
from typing import Any, TypeVar

from rmqkit.errors import PublisherClosed
from rmqkit.publishing.prepare import Delay, PublishMessage
from rmqkit.publishing.publisher import Publisher
from rmqkit.publishing.results import PublishResult
from rmqkit.settings import Settings

T = TypeVar("T")


class SyncPublisher:
    """``with rmqkit.SyncPublisher(settings, topology=...) as pub: pub.publish(...)`` — the
    constructor connects (the options of ``rmqkit.Publisher``); ``call_timeout_s``: how long
    one call waits before it raises TimeoutError (None: as long as the publisher does)."""

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        call_timeout_s: float | None = None,
        **options: Any,
    ) -> None:
        self.call_timeout_s = call_timeout_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="rmqkit-publisher", daemon=True
        )
        self._thread.start()
        self._closed = False
        try:
            self._publisher: Publisher = self._run(self._open(settings, options))
        except BaseException:
            self._stop_loop()
            raise

    async def _open(self, settings: Settings | None, options: dict[str, Any]) -> Publisher:
        publisher = Publisher(settings, **options)
        await publisher.open()
        return publisher

    def __enter__(self) -> SyncPublisher:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def publisher(self) -> Publisher:
        """The async Publisher underneath (runs on this object's own loop)."""
        return self._publisher

    def publish(self, exchange: str, routing_key: str, body: Any, **options: Any) -> PublishResult:
        """``Publisher.publish`` from a synchronous caller (blocks until confirmed)."""
        return self._run(self._publisher.publish(exchange, routing_key, body, **options))

    def publish_many(
        self,
        exchange: str,
        routing_key: str,
        messages: Iterable[PublishMessage | Any],
        *,
        delay: Delay = None,
        headers: dict[str, Any] | None = None,
    ) -> list[PublishResult]:
        """``Publisher.publish_many`` from a synchronous caller."""
        items = list(messages)  # iterated here, in the caller's thread
        return self._run(
            self._publisher.publish_many(exchange, routing_key, items, delay=delay, headers=headers)
        )

    def close(self) -> None:
        """Close the connection and stop the loop's thread; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            asyncio.run_coroutine_threadsafe(self._publisher.close(), self._loop).result(30)
        finally:
            self._stop_loop()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            coro.close()
            raise PublisherClosed("publish on a closed SyncPublisher — make a new one")
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(self.call_timeout_s)
        except TimeoutError:
            future.cancel()
            raise

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()
