"""The RabbitMQ management HTTP API (httpx), scoped to one vhost, with mapped errors."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import httpx

from rmqkit.errors import (
    AccessRefused,
    BrokerError,
    BrokerUnavailable,
    DataError,
    PermissionMissing,
    VhostRefused,
)
from rmqkit.settings import Settings, mask_url

# The columns of /api/nodes rmqkit reads (the full rows carry dozens of metrics per node).
_NODE = "name,running,type,mem_alarm,disk_free_alarm,mem_used,mem_limit,disk_free,disk_free_limit"


def _q(name: str) -> str:
    return quote(name, safe="")


class ManagementClient:
    """A thin client for the parts of ``/api`` rmqkit uses. One vhost per client."""

    def __init__(
        self, base_url: str, vhost: str, *, verify: Any = True, timeout_s: float = 10.0
    ) -> None:
        parts = urlsplit(base_url)
        host = parts.hostname or "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        netloc = host + (f":{parts.port}" if parts.port else "")
        self.base_url = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
        self.shown_url = mask_url(base_url)
        self.vhost = vhost
        self.user = _unq(parts.username)
        auth = (
            httpx.BasicAuth(_unq(parts.username), _unq(parts.password or ""))
            if parts.username
            else None
        )
        self._http = httpx.AsyncClient(
            base_url=self.base_url, auth=auth, verify=verify, timeout=timeout_s
        )

    @classmethod
    def from_settings(cls, settings: Settings, vhost: str | None = None) -> ManagementClient:
        """A client for the management API the settings point at."""
        context = settings.ssl_context()
        return cls(
            settings.resolved_management_url(),
            settings.vhost if vhost is None else vhost,
            verify=context if context is not None else True,
            timeout_s=max(settings.connect_timeout_s, 5.0),
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def request(
        self, method: str, path: str, *, json: Any = None, ok_404: bool = False
    ) -> Any:
        """Call ``/api{path}``; returns decoded JSON (None for an empty body or an allowed 404)."""
        try:
            response = await self._http.request(method, "/api" + path, json=json)
        except httpx.TimeoutException:
            raise BrokerUnavailable(
                f"management API at {self.shown_url} did not answer in time"
            ) from None
        except httpx.TransportError as exc:
            raise BrokerUnavailable(
                f"cannot reach the management API at {self.shown_url} ({exc}) — enable it with "
                "`rabbitmq-plugins enable rabbitmq_management` or set RMQKIT_MANAGEMENT_URL"
            ) from None
        status = response.status_code
        if status == 404 and ok_404:
            return None
        if status in (401, 403):
            raise await self._refusal(method, path, _reason(response))
        if status == 404 and path.startswith(
            ("/vhosts/", "/queues/", "/exchanges/", "/bindings/", "/policies/")
        ):
            # Same exit code as AMQP's refusal of a vhost (77): missing or not visible to us.
            raise VhostRefused(_vhost_missing(self.vhost))
        if status == 400:
            raise DataError(f"management API rejected {method} {path}: {_reason(response)}")
        if status >= 400:
            raise BrokerError(
                f"management API {method} {path} failed with HTTP {status}: {_reason(response)}"
            )
        if not response.content:
            return None
        return response.json()

    async def _refusal(self, method: str, path: str, reason: str) -> AccessRefused:
        """What a 401/403 means: a failed login only when the broker says so (or, for a
        reason it does not name, when ``/api/whoami`` refuses too); otherwise the tag or
        vhost permission this request needs, and the tags the user has."""
        user = self.user or "(none)"
        need = missing_for(reason, path, self.vhost)
        tags: list[str] | None = None
        if reason not in _LOGIN_FAILED:
            tags = await self._tags()
            if need is None and tags is not None:
                need = f"a permission this request needs ({reason})"
        if need is None:
            return AccessRefused(
                f"management API at {self.shown_url} refused the login of user {user!r} — check "
                "the user and password"
            )
        has = "" if tags is None else f" (tags: {', '.join(tags) or 'none'})"
        return PermissionMissing(
            f"management API refused {method} /api{path.split('?')[0]} for user {user!r}{has}: "
            f"it needs {need} — docs/permissions.md lists what each command needs"
        )

    async def _tags(self) -> list[str] | None:
        """The user's tags from ``/api/whoami`` (None when it cannot say: no management tag,
        or no answer). The login is good whenever this answers 200."""
        try:
            who = await self._http.get("/api/whoami")
            body = who.json() if who.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None
        if not isinstance(body, dict):
            return None
        raw = body.get("tags") or []
        # 3.x and 4.x give a list; older releases a comma-separated string.
        return [str(t) for t in (raw.split(",") if isinstance(raw, str) else raw) if t]

    # --- reads -------------------------------------------------------------------------
    async def overview(self) -> dict[str, Any]:
        result: dict[str, Any] = await self.request("GET", "/overview")
        return result

    async def queues(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = await self.request("GET", f"/queues/{_q(self.vhost)}")
        return result

    async def queue(self, name: str) -> dict[str, Any] | None:
        result: dict[str, Any] | None = await self.request(
            "GET", f"/queues/{_q(self.vhost)}/{_q(name)}", ok_404=True
        )
        return result

    async def exchanges(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = await self.request("GET", f"/exchanges/{_q(self.vhost)}")
        return result

    async def bindings(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = await self.request("GET", f"/bindings/{_q(self.vhost)}")
        return result

    async def policies(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = await self.request("GET", f"/policies/{_q(self.vhost)}")
        return result

    async def operator_policies(self) -> list[dict[str, Any]]:
        result = await self.request("GET", f"/operator-policies/{_q(self.vhost)}", ok_404=True)
        return list(result or [])

    async def vhost_info(self) -> dict[str, Any]:
        """``/api/vhosts/{vhost}``: the vhost's own ``message_stats`` (unroutable counts).

        ``/api/vhosts/{vhost}`` needs the administrator tag; for other users the row comes
        from the listing, which shows each vhost the user may see (every vhost to the
        monitoring tag). A vhost missing from it is the same refusal as a 404."""
        try:
            result: dict[str, Any] = await self.request("GET", f"/vhosts/{_q(self.vhost)}")
        except PermissionMissing:
            rows = await self.request("GET", "/vhosts")
            for row in rows or []:
                if isinstance(row, dict) and row.get("name") == self.vhost:
                    return row
            raise VhostRefused(_vhost_missing(self.vhost)) from None
        return result

    async def nodes(self) -> list[dict[str, Any]] | None:
        """``/api/nodes``: every node of the cluster, with its resource alarms and the usage
        behind them; None when this user may not read it (it needs the monitoring tag)."""
        try:
            result: list[dict[str, Any]] = await self.request("GET", f"/nodes?columns={_NODE}")
        except AccessRefused:
            return None
        return result

    async def connections(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = await self.request(
            "GET", f"/vhosts/{_q(self.vhost)}/connections"
        )
        return result

    async def channels(self, columns: str) -> list[dict[str, Any]]:
        """The vhost's channels (every user's with the monitoring tag, else the user's own)."""
        result = await self.request(
            "GET", f"/vhosts/{_q(self.vhost)}/channels?columns={columns}", ok_404=True
        )
        return [c for c in result or [] if isinstance(c, dict)]

    async def feature_flags(self) -> list[dict[str, Any]]:
        """``/api/feature-flags`` (the administrator tag on 3.x; any management tag on 4.x)."""
        result = await self.request("GET", "/feature-flags")
        return [f for f in result or [] if isinstance(f, dict)]

    # --- writes ------------------------------------------------------------------------
    async def put_policy(
        self, name: str, pattern: str, definition: dict[str, Any], priority: int, apply_to: str
    ) -> None:
        body = {
            "pattern": pattern,
            "definition": definition,
            "priority": priority,
            "apply-to": apply_to,
        }
        await self.request("PUT", f"/policies/{_q(self.vhost)}/{_q(name)}", json=body)

    async def delete_policy(self, name: str) -> None:
        await self.request("DELETE", f"/policies/{_q(self.vhost)}/{_q(name)}", ok_404=True)

    async def close_connection(self, name: str) -> None:
        await self.request("DELETE", f"/connections/{_q(name)}", ok_404=True)

    async def create_vhost(self, name: str, user: str) -> None:
        """Create vhost ``name`` and give ``user`` full permissions on it (tests, quickstart)."""
        await self.request("PUT", f"/vhosts/{_q(name)}", json={})
        perms = {"configure": ".*", "write": ".*", "read": ".*"}
        await self.request("PUT", f"/permissions/{_q(name)}/{_q(user)}", json=perms)

    async def delete_vhost(self, name: str) -> None:
        await self.request("DELETE", f"/vhosts/{_q(name)}", ok_404=True)


# The reasons RabbitMQ's management API gives in a 401 body (3.10 to 4.3), and what each
# means the user lacks. Only "Login failed" is a wrong user or password.
_LOGIN_FAILED = frozenset({"Login failed", "not_authorised", "not_authorized"})
_TAGS = {
    "Not administrator user": "the administrator tag",
    "Not monitor user": "the monitoring tag (or administrator)",
    "Not management user": "a management tag (management, policymaker, monitoring or "
    "administrator)",
    "Not policymaker user": "the policymaker tag (or administrator)",
}


def missing_for(reason: str, path: str, vhost: str) -> str | None:
    """What a 401 ``reason`` for ``path`` says the user lacks, in words; None when the
    reason does not say (a failed login, or a reason this table does not know)."""
    if reason in _TAGS:
        return _TAGS[reason]
    if reason == "User not authorised to access virtual host":
        return f"permissions on vhost {vhost!r} (rabbitmqctl set_permissions -p {vhost} ...)"
    if reason == "User not authorised to access object":
        if path.startswith(("/policies/", "/operator-policies/", "/parameters/")):
            return "the policymaker tag (or administrator)"
        return f"permissions on this object in vhost {vhost!r}"
    return None


def _vhost_missing(vhost: str) -> str:
    return (
        f"management API: vhost {vhost!r} does not exist or this user cannot see it — create "
        "it (`rmqkit declare --create-vhost`) or grant access (rabbitmqctl set_permissions)"
    )


def _unq(text: str | None) -> str:
    from urllib.parse import unquote

    return unquote(text or "")


def _reason(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:200]
    if isinstance(body, dict):
        return str(body.get("reason") or body.get("error") or body)[:300]
    return str(body)[:300]


@asynccontextmanager
async def management(
    settings: Settings, vhost: str | None = None
) -> AsyncIterator[ManagementClient]:
    """``async with management(settings) as api:`` — a client that is always closed."""
    client = ManagementClient.from_settings(settings, vhost)
    try:
        yield client
    except VhostRefused as exc:
        if exc.listed:
            raise
        # Worth one more call: which vhosts this user can see (vhosts imports this module).
        from rmqkit.broker.vhosts import vhost_refusal, visible_vhosts

        scoped = settings if vhost is None else settings.for_vhost(vhost)
        visible = await visible_vhosts(scoped)
        raise vhost_refusal(scoped, client.shown_url, visible) from None
    finally:
        await client.aclose()
