"""Whether the AMQP connection and the management API reach the same broker.

The management URL defaults to port 15672 of the AMQP host, so an ``RMQKIT_URL`` on another
port (a second node, a port-forward, a test broker) quietly pairs AMQP on one cluster with the
management API of another: ``status`` then shows the other broker's vhost. Both sides report a
cluster name (AMQP in its server properties, the API in ``/api/overview``); they must match.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from rmqkit.broker.amqp import parse_version
from rmqkit.broker.session import session
from rmqkit.errors import BrokerUnavailable
from rmqkit.settings import Settings, mask_url


@dataclass(frozen=True)
class BrokerIdentity:
    """What the AMQP connection says about its broker, beside what the management API says."""

    amqp_url: str  # masked
    management_url: str  # masked
    amqp_error: str | None = None  # the AMQP connection failed: why
    amqp_cluster: str | None = None
    amqp_version: tuple[int, int, int] | None = None
    management_cluster: str | None = None
    management_version: tuple[int, int, int] | None = None

    @property
    def mismatch(self) -> str | None:
        """Why the two are not the same broker, or None (unknown names are not a mismatch)."""
        if self.amqp_error is not None:
            return None
        if self.amqp_cluster and self.management_cluster:
            if self.amqp_cluster == self.management_cluster:
                return None
            return (
                f"AMQP at {self.amqp_url} is cluster {self.amqp_cluster!r} but the "
                f"management API at {self.management_url} is cluster "
                f"{self.management_cluster!r}"
            )
        if self.amqp_version and self.management_version != self.amqp_version:
            # no cluster name on one side (an old broker): the versions still tell two apart
            return (
                f"AMQP at {self.amqp_url} is RabbitMQ {_v(self.amqp_version)} but the "
                f"management API at {self.management_url} is {_v(self.management_version)}"
            )
        return None

    def fix(self) -> str:
        """What to do about a mismatch or an unreachable AMQP port."""
        if self.amqp_error is not None:
            return (
                "start RabbitMQ or fix RMQKIT_URL (--url): consumers and publishers cannot "
                "connect even though the management API answers"
            )
        return (
            "point RMQKIT_MANAGEMENT_URL (--management-url) at the management API of the broker "
            "RMQKIT_URL names (it defaults to port 15672 of the AMQP host)"
        )


def _v(version: tuple[int, int, int] | None) -> str:
    if version is None:
        return "unknown"
    return ".".join(map(str, version))


async def broker_identity(settings: Settings, overview: dict[str, Any]) -> BrokerIdentity:
    """Connect over AMQP and set what it reports beside ``overview`` (``/api/overview``).
    An unreachable AMQP port is recorded in ``amqp_error``, not raised; a refused login
    still raises AccessRefused (77)."""
    base = BrokerIdentity(
        amqp_url=mask_url(settings.amqp_urls[0]),
        management_url=mask_url(settings.resolved_management_url()),
        management_cluster=str(overview.get("cluster_name") or "") or None,
        management_version=parse_version(str(overview.get("rabbitmq_version") or "0.0.0")),
    )
    try:
        async with session(settings, name="rmqkit identity") as s:
            return replace(base, amqp_cluster=s.cluster_name, amqp_version=s.server_version)
    except BrokerUnavailable as exc:
        return replace(base, amqp_error=str(exc).split(" — ")[0])


__all__ = ["BrokerIdentity", "broker_identity"]
