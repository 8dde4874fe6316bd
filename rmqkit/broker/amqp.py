"""AMQP connections (aio-pika) with rmqkit's error mapping and cluster URL failover."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, TypeAlias

import aio_pika
import aiormq.abc
import aiormq.exceptions as amqp_errors
from aio_pika.abc import AbstractConnection, AbstractIncomingMessage

from rmqkit.errors import (
    AccessRefused,
    BrokerError,
    BrokerUnavailable,
    DataError,
    PermissionMissing,
    RmqkitError,
    TopologyConflict,
    VhostRefused,
)
from rmqkit.settings import Settings, mask_url, vhost_of

Connection: TypeAlias = AbstractConnection
"""An open client connection, as ``connect`` and ``connection`` give it (for type hints outside
the broker layer, which does not import the client)."""

IncomingMessage: TypeAlias = AbstractIncomingMessage
"""A message as the client's own consumer API delivers it (``rmqkit.Message.from_delivery``)."""


def parse_version(text: str) -> tuple[int, int, int]:
    """``"3.10.8"`` → ``(3, 10, 8)``; unknown parts are 0 (so comparisons stay safe)."""
    parts: list[int] = []
    for piece in text.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    while len(parts) < 3:
        parts.append(0)
    return parts[0], parts[1], parts[2]


def refused_vhost(exc: BaseException) -> bool:
    """Whether a failed connection attempt is the broker refusing the URL's vhost."""
    return isinstance(exc, amqp_errors.ConnectionNotAllowed) or (
        isinstance(exc, amqp_errors.InvalidFrameError) and "Connection.Close" in str(exc)
    )


def map_connect_error(exc: BaseException, url: str) -> RmqkitError:
    """Turn a failure to open a connection to ``url`` into an rmqkit error."""
    shown = mask_url(url)
    if isinstance(exc, amqp_errors.ProbableAuthenticationError | amqp_errors.AuthenticationError):
        return AccessRefused(
            f"broker at {shown} refused the login — check the user and password in RMQKIT_URL"
        )
    if refused_vhost(exc):
        return VhostRefused(
            f"broker at {shown} refused vhost {vhost_of(url)!r}: it does not exist or the user "
            "has no permissions on it — create it or grant access (rabbitmqctl set_permissions)"
        )
    if isinstance(exc, TimeoutError):
        return BrokerUnavailable(
            f"broker at {shown} did not answer in time — is RabbitMQ running and reachable?"
        )
    if isinstance(exc, OSError | amqp_errors.AMQPConnectionError):
        reason = str(exc).strip() or type(exc).__name__
        return BrokerUnavailable(
            f"cannot connect to broker at {shown} ({reason}) — is RabbitMQ running? "
            "(scripts/broker-up starts a local one)"
        )
    return BrokerError(f"connecting to {shown} failed: {type(exc).__name__}: {exc}")


def map_channel_error(exc: BaseException, doing: str) -> RmqkitError | None:
    """Map a channel-level AMQP error raised while ``doing`` something; None if not AMQP."""
    if isinstance(exc, amqp_errors.ChannelPreconditionFailed):
        return TopologyConflict(
            f"broker rejected {doing}: {exc.args[0] if exc.args else exc} "
            "— run `rmqkit plan` to see the conflict and its fix"
        )
    if isinstance(exc, amqp_errors.ChannelAccessRefused):
        return PermissionMissing(
            f"broker refused {doing}: {exc} — grant that permission (docs/permissions.md lists "
            "what each command needs)"
        )
    if isinstance(exc, amqp_errors.ChannelNotFoundEntity):
        return DataError(f"broker could not find an object while {doing}: {exc}")
    if isinstance(exc, amqp_errors.AMQPConnectionError | ConnectionError):
        return BrokerUnavailable(f"connection lost while {doing}: {exc}")
    if isinstance(exc, amqp_errors.AMQPError):
        return BrokerError(f"broker error while {doing}: {type(exc).__name__}: {exc}")
    return None


@contextmanager
def amqp_errors_mapped(doing: str) -> Iterator[None]:
    """Re-raise AMQP errors inside the block as rmqkit errors describing ``doing``."""
    try:
        yield
    except RmqkitError:
        raise
    except Exception as exc:
        mapped = map_channel_error(exc, doing)
        if mapped is None:
            raise
        raise mapped from exc


async def connect(
    settings: Settings,
    *,
    robust: bool = False,
    name: str = "rmqkit",
    urls: list[str] | None = None,
    **kwargs: Any,
) -> AbstractConnection:
    """Open a connection to the first URL that answers, in the order configured (or ``urls``).

    Raises AccessRefused (77) for a refused login, BrokerUnavailable (69) when no URL answers
    within ``settings.connect_timeout_s`` each.
    """
    errors: list[RmqkitError] = []
    ssl_context = settings.ssl_context()
    for url in urls or settings.amqp_urls:
        try:
            opener = aio_pika.connect_robust if robust else aio_pika.connect
            extra: dict[str, Any] = {"client_properties": {"connection_name": name}}
            if ssl_context is not None:
                extra["ssl_context"] = ssl_context
            return await asyncio.wait_for(
                opener(url, timeout=settings.connect_timeout_s, **extra, **kwargs),
                timeout=settings.connect_timeout_s + 1,
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            mapped = map_connect_error(exc, url)
            if isinstance(mapped, AccessRefused) and refused_vhost(exc):
                # Worth a call to the management API: which vhosts this user can see.
                from rmqkit.broker.vhosts import vhost_refusal, visible_vhosts

                visible = await visible_vhosts(settings.for_vhost(vhost_of(url)))
                mapped = vhost_refusal(settings.for_vhost(vhost_of(url)), mask_url(url), visible)
            if isinstance(mapped, AccessRefused):
                raise mapped from None
            errors.append(mapped)
    if len(errors) == 1:
        raise errors[0]
    raise BrokerUnavailable(
        "no broker answered: " + "; ".join(str(e).split(" — ")[0] for e in errors)
    )


@asynccontextmanager
async def connection(settings: Settings, **kwargs: Any) -> AsyncIterator[AbstractConnection]:
    """``async with connection(settings) as conn:`` — connect, and always close."""
    conn = await connect(settings, **kwargs)
    try:
        yield conn
    finally:
        await conn.close()


def raw_connection(conn: AbstractConnection) -> aiormq.abc.AbstractConnection:
    """The aiormq connection under an open aio-pika one: the one place rmqkit reaches it
    (``rmqkit.broker.session`` works on it; aio-pika's own channel objects cost a wrapper per
    message, and rmqkit's publisher needs the client's channel)."""
    transport = conn.transport
    if transport is None:
        raise BrokerUnavailable("the connection to the broker is closed")
    return transport.connection


def server_version(conn: AbstractConnection) -> tuple[int, int, int]:
    """The broker version this connection reports in its server properties."""
    props: Any = raw_connection(conn).server_properties if conn.transport else {}
    raw = props.get("version", "0.0.0")
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return parse_version(text)
