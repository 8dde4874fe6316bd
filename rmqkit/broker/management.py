"""The RabbitMQ management HTTP API (httpx), scoped to one vhost, with mapped errors."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import httpx

from rmqkit.errors import AccessRefused, BrokerError, BrokerUnavailable, DataError
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
        if status == 401:
            raise AccessRefused(
                f"management API at {self.shown_url} refused the login — check the credentials"
            )
        if status == 403:
            raise AccessRefused(
                f"management API refused {method} {path}: the user needs the management tag "
                "(policymaker or administrator for policies)"
            )
        if status == 404 and path.startswith(
            ("/vhosts/", "/queues/", "/exchanges/", "/bindings/", "/policies/")
        ):
            # Same exit code as AMQP's refusal of a vhost (77): missing or not visible to us.
            raise AccessRefused(
                f"management API: vhost {self.vhost!r} does not exist or this user cannot see "
                "it — create it or grant access (rabbitmqctl set_permissions)"
            )
        if status == 400:
            raise DataError(f"management API rejected {method} {path}: {_reason(response)}")
        if status >= 400:
            raise BrokerError(
                f"management API {method} {path} failed with HTTP {status}: {_reason(response)}"
            )
        if not response.content:
            return None
        return response.json()

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
        """``/api/vhosts/{vhost}``: the vhost's own ``message_stats`` (unroutable counts)."""
        result: dict[str, Any] = await self.request("GET", f"/vhosts/{_q(self.vhost)}")
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
    finally:
        await client.aclose()
