"""What `rmqkit doctor --target 4.3` reads beyond the snapshot: the vhost's channels (global
QoS) and the cluster's feature flags. The checks themselves are pure
(``rmqkit.health.checks.upgrade``); docs/doctor.md lists them with what 4.3 does."""

from __future__ import annotations

from typing import Any, Final

from rmqkit.broker.management import ManagementClient
from rmqkit.errors import AccessRefused, UsageError
from rmqkit.health.findings import UpgradeFacts

TARGETS: Final = ("4.3",)
"""The versions ``--target`` knows; each has its checklist in ``checks.upgrade``."""

_CHANNEL = "name,user,prefetch_count,global_prefetch_count,consumer_count,connection_details"


def parse_target(text: str) -> tuple[int, int]:
    """``"4.3"`` → ``(4, 3)``; a version without a checklist is a usage error (64)."""
    if text.strip() not in TARGETS:
        raise UsageError(
            f"--target {text!r}: the preflight knows {', '.join(TARGETS)} "
            "(the release whose changes it checks for)"
        )
    major, minor = text.strip().split(".")
    return int(major), int(minor)


async def read_upgrade_facts(
    api: ManagementClient, target: tuple[int, int], rmqkit_queues: frozenset[str]
) -> UpgradeFacts:
    """The channels of the vhost and the feature flags, each None when refused (channels of
    other users need the monitoring tag; feature flags the administrator tag on 3.x)."""
    channels: list[dict[str, Any]] | None
    try:
        channels = await api.channels(_CHANNEL)
    except AccessRefused:
        channels = None
    flags: dict[str, tuple[str, str]] | None
    try:
        flags = {
            str(r.get("name")): (str(r.get("state", "")), str(r.get("stability", "")))
            for r in await api.feature_flags()
        }
    except AccessRefused:
        flags = None
    return UpgradeFacts(target, channels, flags, rmqkit_queues)


__all__ = ["TARGETS", "parse_target", "read_upgrade_facts"]
