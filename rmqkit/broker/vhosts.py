"""Vhosts over the management API: whether one exists, creating one for ``declare
--create-vhost``, and the vhosts a user can see (named when the broker refuses one)."""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

from rmqkit.broker.management import ManagementClient, management
from rmqkit.errors import AccessRefused, RmqkitError, VhostRefused
from rmqkit.settings import Settings


def management_user(settings: Settings) -> str:
    """The user the management API is called as (the URL's, else the AMQP URL's)."""
    return unquote(urlsplit(settings.resolved_management_url()).username or "")


async def vhost_exists(api: ManagementClient) -> bool:
    """Whether the client's vhost exists, as far as this user can see: the listing shows
    every vhost to the administrator and monitoring tags, and to others those they have
    permissions on (``/api/vhosts/{name}`` itself needs the administrator tag)."""
    return api.vhost in await vhost_names(api)


async def vhost_names(api: ManagementClient) -> list[str]:
    """The vhosts this user can see (the listing, names only), sorted."""
    rows = await api.request("GET", "/vhosts?columns=name")
    return sorted(str(row["name"]) for row in rows or [] if isinstance(row, dict) and "name" in row)


async def create_vhost(api: ManagementClient, user: str) -> None:
    """Create the client's vhost and give ``user`` (the one declaring) full permissions on
    it, so the declaration that follows may create its objects. Needs the administrator tag."""
    try:
        await api.create_vhost(api.vhost, user)
    except AccessRefused:
        raise AccessRefused(
            f"cannot create vhost {api.vhost!r}: creating a vhost needs the administrator tag, "
            f"which user {user!r} does not have — have an administrator run `rmqkit declare "
            f"--create-vhost` (or `rabbitmqctl add_vhost {api.vhost}`), then declare as this user"
        ) from None


async def visible_vhosts(settings: Settings) -> list[str] | None:
    """The vhosts the settings' user can see, sorted; None when the management API cannot
    say (not enabled, unreachable, or the login refused there too)."""
    try:
        async with management(settings) as api:
            return await vhost_names(api)
    except RmqkitError:
        return None


def vhost_refusal(settings: Settings, shown_url: str, visible: list[str] | None) -> VhostRefused:
    """The error for a vhost the broker refused at connection: it is missing, or this user
    has no permissions on it; names the vhosts the user can see and both fixes."""
    vhost = settings.vhost
    user = management_user(settings) or "this user"
    if visible is None:
        seen = ""
    elif vhost in visible:
        seen = f"; it exists, but user {user!r} has no permissions on it"
    else:
        listed = ", ".join(repr(v) for v in visible) or "none"
        seen = f"; vhosts user {user!r} can see: {listed}"
    refusal = VhostRefused(
        f"broker at {shown_url} refused vhost {vhost!r}: it does not exist or the user has no "
        f"permissions on it{seen} — fix the vhost in RMQKIT_URL, create it (`rmqkit declare "
        f"--create-vhost`, as an administrator) or grant access (`rabbitmqctl set_permissions "
        f"-p {vhost} {user} ...`)"
    )
    refusal.listed = True
    return refusal


__all__ = [
    "create_vhost",
    "management_user",
    "vhost_exists",
    "vhost_names",
    "vhost_refusal",
    "visible_vhosts",
]
