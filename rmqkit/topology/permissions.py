"""The vhost's permissions as topology files state them (``[vhost.permissions.USER]``): the
union of several files, how ``plan`` compares them with the broker and how ``declare`` sets
them.

Users themselves are not managed: a password does not belong in a topology file, so a user
the file names must already exist (plan reports a missing one as a conflict). Users the file
does not name keep their permissions; plan lists them as orphans.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rmqkit.errors import AccessRefused, TopologyFileError

if TYPE_CHECKING:
    from rmqkit.broker.management import ManagementClient
    from rmqkit.topology.live import Change
    from rmqkit.topology.model import Topology

PATTERNS = ("configure", "write", "read")


@dataclass(frozen=True)
class PermissionSpec:
    """One user's configure/write/read patterns in the vhost, and the file that states them."""

    user: str
    configure: str
    write: str
    read: str
    source: str

    def patterns(self) -> dict[str, str]:
        return {"configure": self.configure, "write": self.write, "read": self.read}

    def describe(self) -> str:
        return shown(self.patterns())


def shown(patterns: dict[str, str]) -> str:
    """``configure '' write '^orders\\.' read '.*'``: patterns as written in the file (not
    repr's doubled backslashes)."""
    return " ".join(f"{k} '{v}'" for k, v in patterns.items())


@dataclass(frozen=True)
class LivePermissions:
    """The vhost's permissions on the broker. ``by_user`` and ``users`` are None when the
    asking user may not read them (both need the administrator tag)."""

    asked_by: str
    by_user: dict[str, dict[str, str]] | None
    users: frozenset[str] | None


def desired_permissions(topologies: Sequence[Topology]) -> list[PermissionSpec]:
    """Every file's ``[vhost.permissions]``, as one list; a user two files name must have the
    same patterns in both (TopologyFileError naming both files otherwise)."""
    found: dict[str, PermissionSpec] = {}
    for topology in topologies:
        for user, model in topology.model.vhost.permissions.items():
            spec = PermissionSpec(user, model.configure, model.write, model.read, topology.source)
            first = found.get(user)
            if first is None:
                found[user] = spec
            elif first.patterns() != spec.patterns():
                raise TopologyFileError(
                    topology.source,
                    f"gives user {user!r} {spec.describe()}, but {first.source} gives "
                    f"{first.describe()}: files meant for one vhost must agree",
                    key=f"vhost.permissions.{user}",
                )
    return list(found.values())


async def read_permissions(api: ManagementClient, asked_by: str) -> LivePermissions:
    """The vhost's permissions and the broker's user names, or None for each where this
    user may not read them."""
    from urllib.parse import quote

    try:
        rows = await api.request("GET", f"/vhosts/{quote(api.vhost, safe='')}/permissions")
    except AccessRefused:
        return LivePermissions(asked_by, None, None)
    by_user = {str(row["user"]): {k: str(row.get(k, "")) for k in PATTERNS} for row in rows or []}
    return LivePermissions(asked_by, by_user, await user_names(api))


async def user_names(api: ManagementClient) -> frozenset[str] | None:
    """The broker's user names (only the names: the rows also carry password hashes), or
    None when this user may not list users (that needs the administrator tag)."""
    try:
        users = await api.request("GET", "/users?columns=name")
    except AccessRefused:
        return None
    return frozenset(str(u["name"]) for u in users or [] if u.get("name"))


def permission_changes(
    desired: Sequence[PermissionSpec], live: LivePermissions | None
) -> list[Change]:
    """One verdict per user the files name, and an orphan note per other user with
    permissions here (but the one asking: it is the one declaring)."""
    from rmqkit.topology.live import Change

    if not desired:
        return []
    if live is None or live.by_user is None:
        who = f"user {live.asked_by!r}" if live is not None else "this user"
        return [
            Change(
                "permission",
                spec.user,
                "change",
                f"not verified: {who} may not read permissions (that needs the administrator "
                f"tag); declare sets {spec.describe()}",
            )
            for spec in desired
        ]
    changes: list[Change] = []
    for spec in desired:
        have = live.by_user.get(spec.user)
        if live.users is not None and spec.user not in live.users:
            changes.append(
                Change(
                    "permission",
                    spec.user,
                    "conflict",
                    f"user {spec.user!r} does not exist on the broker",
                    f"create the user first (rabbitmqctl add_user {spec.user} PASSWORD, or your "
                    "identity provider); rmqkit does not handle passwords",
                )
            )
        elif have is None:
            changes.append(Change("permission", spec.user, "create", spec.describe()))
        elif have != spec.patterns():
            diffs = "; ".join(
                f"{k} '{have[k]}' → '{v}'" for k, v in spec.patterns().items() if have[k] != v
            )
            changes.append(Change("permission", spec.user, "change", diffs))
        else:
            changes.append(Change("permission", spec.user, "in-sync"))
    named = {spec.user for spec in desired}
    for user, patterns in sorted(live.by_user.items()):
        if user in named or user == live.asked_by:
            continue
        changes.append(
            Change(
                "permission",
                user,
                "orphan",
                f"has {shown(patterns)} here, which the file does not name; declare leaves it",
                f"add [vhost.permissions.{user}] to the file, or "
                f"rabbitmqctl clear_permissions -p VHOST {user}",
            )
        )
    return changes


async def apply_permissions(
    api: ManagementClient, desired: Sequence[PermissionSpec], users: set[str]
) -> None:
    """Set the patterns of ``desired``'s users named in ``users`` (the ones plan found to
    create or change)."""
    from urllib.parse import quote

    vhost = quote(api.vhost, safe="")
    for spec in desired:
        if spec.user in users:
            await api.request(
                "PUT", f"/permissions/{vhost}/{quote(spec.user, safe='')}", json=spec.patterns()
            )


__all__ = [
    "LivePermissions",
    "PermissionSpec",
    "apply_permissions",
    "desired_permissions",
    "permission_changes",
    "read_permissions",
]
