"""Settings from flags, environment (``RMQKIT_*``), ``.env`` and defaults, in that order.

No I/O happens at import; secrets are ``SecretStr`` and only leave this module masked,
except through the accessors that hand a URL to a client library.
"""

from __future__ import annotations

import re
import ssl
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from pydantic import SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from rmqkit.errors import ConfigError, UsageError
from rmqkit.urls import malformed_userinfo, split_urls

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/"
DEFAULT_MANAGEMENT_PORT = 15672
DEFAULT_MANAGEMENT_TLS_PORT = 15671
_AMQP_SCHEMES = {"amqp": 5672, "amqps": 5671}


# What comes before the user in a URL typed by hand: a scheme with or without its colon and
# slashes ("amqp://", "amqp//", "amqp:/"). At least one slash: "ops:pw@host" has no scheme.
_LOOSE_PREFIX = re.compile(r"^(?:[A-Za-z][A-Za-z0-9+.-]*:?/+)?")


def mask_url(url: str) -> str:
    """Return ``url`` with its password replaced by ``***`` (safe to print or log).

    Also for a URL typed wrong (``amqp//ops:pw@host``, ``ops:pw@host``, a bad port), which is
    exactly what an error message quotes: anything between the user's ``:`` and the last ``@``
    is masked then — also when a password that was not percent-encoded holds an ``@`` or
    ``/`` (``amqp://u:p@ss/word@host``: the parser's host ``ss`` is part of the password)."""
    if malformed_userinfo(url) is not None:
        return _mask_loosely(url)
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:  # not a number, or out of range
        return _mask_loosely(url)
    if parts.password is None:
        return _mask_loosely(url) if "@" in url else url
    host = parts.hostname or ""
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    netloc = f"{parts.username or ''}:***@{host}"
    if port is not None:
        netloc += f":{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _mask_loosely(url: str) -> str:
    at = url.rfind("@")
    if at < 0:
        return url
    head, tail = url[:at], url[at:]
    prefix = _LOOSE_PREFIX.match(head)
    start = prefix.end() if prefix else 0
    colon = head.find(":", start)
    if colon < 0:  # a user without a password
        return url
    return f"{head[: colon + 1]}***{tail}"


def vhost_of(url: str) -> str:
    """The virtual host an AMQP URL names, decoded as aio-pika does (empty path is ``/``)."""
    path = urlsplit(url).path
    return unquote(path[1:]) if len(path) > 1 else "/"


def with_vhost(url: str, vhost: str) -> str:
    """Return the AMQP ``url`` pointed at ``vhost`` (URL-encoded, so ``/`` becomes ``%2F``)."""
    parts = urlsplit(url)
    return urlunsplit(
        (parts.scheme, parts.netloc, "/" + quote(vhost, safe=""), parts.query, parts.fragment)
    )


class Settings(BaseSettings):
    """Everything rmqkit needs to reach a broker.

    ``RMQKIT_URL`` carries credentials and the vhost (``amqp://user:pass@host:5672/vhost``,
    URL-encoded). Several comma-separated URLs name the nodes of a cluster; they are tried
    in order on connect and reconnect.
    """

    model_config = SettingsConfigDict(
        env_prefix="RMQKIT_", env_file=".env", env_file_encoding="utf-8", extra="ignore"
    )

    url: SecretStr = SecretStr(DEFAULT_URL)
    management_url: SecretStr | None = None
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    tls_verify: bool = True
    connect_timeout_s: float = 5.0
    # OpenTelemetry tracing (rmqkit.tracing, docs/observability.md): "auto" traces when the
    # API is installed and a tracer provider configured; "on" insists; "off" never.
    tracing: Literal["auto", "on", "off"] = "auto"
    # The consumer's semantic-convention metrics through OpenTelemetry too (rmqkit.otel_metrics:
    # OTLP export beside Prometheus), by the same rule.
    otel_metrics: Literal["auto", "on", "off"] = "auto"
    # The key ring of field-level encryption (docs/encryption.md): a file path or the JSON
    # itself (from a secret manager). Loaded by ``rmqkit.cli.keyring_settings.keyring_of``
    # (settings sit below every layer and cannot import rmqkit.crypto); never printed.
    keyring_file: Path | None = None
    keyring: SecretStr | None = None

    @field_validator("keyring_file", "keyring", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        # RMQKIT_KEYRING_FILE= (empty) would be Path("."): unset, as keyring_from_env reads it
        return None if value == "" else value

    @field_validator("url")
    @classmethod
    def _check_urls(cls, value: SecretStr) -> SecretStr:
        raw = value.get_secret_value()
        urls, stray = split_urls(raw)
        if not urls:
            raise ValueError("RMQKIT_URL is empty")
        if stray is not None:  # the entry is quoted nowhere: it may be the rest of a password
            raise ValueError(
                f"{_mask_loosely(raw)} is malformed: entry {stray} of {len(urls)} (split at ',') "
                "is not an AMQP URL — a ',' in a password is percent-encoded as %2C"
            )
        for url in urls:
            _check_userinfo(url)
            parts = urlsplit(url)
            if parts.scheme not in _AMQP_SCHEMES or not parts.hostname:
                raise ValueError(
                    f"{mask_url(url)} is not an AMQP URL (amqp://user:pass@host:5672/vhost)"
                )
            _check_port(url, "amqp://user:pass@host:5672/vhost")
            if vhost_of(url) != vhost_of(urls[0]):
                raise ValueError("all RMQKIT_URL entries must name the same vhost")
        return value

    @field_validator("management_url")
    @classmethod
    def _check_management_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value().strip():
            return None
        url = value.get_secret_value().strip()
        _check_userinfo(url)
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{mask_url(url)} is not an HTTP URL (http://host:15672)")
        _check_port(url, "http://host:15672")
        return value

    @property
    def amqp_urls(self) -> list[str]:
        """The AMQP URLs in connect order, with credentials (for client libraries only)."""
        raw = self.url.get_secret_value()
        return [u.strip() for u in raw.split(",") if u.strip()]

    @property
    def vhost(self) -> str:
        """The virtual host all URLs point at."""
        return vhost_of(self.amqp_urls[0])

    def for_vhost(self, vhost: str) -> Settings:
        """These settings with every URL pointed at ``vhost`` (the global ``--vhost``): AMQP
        connections and the management API (scoped by ``vhost``) both follow it."""
        urls = ",".join(with_vhost(url, vhost) for url in self.amqp_urls)
        return self.model_copy(update={"url": SecretStr(urls)})

    @property
    def uses_tls(self) -> bool:
        return urlsplit(self.amqp_urls[0]).scheme == "amqps"

    def resolved_management_url(self) -> str:
        """The management API base URL with credentials (derived from the AMQP URL if unset)."""
        if self.management_url is not None:
            url = self.management_url.get_secret_value().rstrip("/")
            parts = urlsplit(url)
            if parts.username is None:
                amqp = urlsplit(self.amqp_urls[0])
                user = quote(unquote(amqp.username or "guest"), safe="")
                password = quote(unquote(amqp.password or "guest"), safe="")
                url = urlunsplit(
                    (parts.scheme, f"{user}:{password}@{parts.netloc}", parts.path, "", "")
                )
            return url
        amqp = urlsplit(self.amqp_urls[0])
        scheme = "https" if amqp.scheme == "amqps" else "http"
        port = DEFAULT_MANAGEMENT_TLS_PORT if scheme == "https" else DEFAULT_MANAGEMENT_PORT
        host = amqp.hostname or "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        user = amqp.username or "guest"
        password = amqp.password or "guest"
        return f"{scheme}://{user}:{password}@{host}:{port}"

    def ssl_context(self) -> ssl.SSLContext | None:
        """A TLS context for amqps/https, built from the CA and client-cert settings."""
        if not self.uses_tls and self.ca_file is None and self.cert_file is None:
            return None
        try:
            context = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
            if self.cert_file is not None:
                context.load_cert_chain(
                    str(self.cert_file), str(self.key_file) if self.key_file else None
                )
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"TLS files cannot be loaded: {exc} — check RMQKIT_CA_FILE, "
                "RMQKIT_CERT_FILE and RMQKIT_KEY_FILE"
            ) from exc
        if not self.tls_verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context

    def masked(self) -> dict[str, Any]:
        """The effective settings with every secret masked, for `rmqkit config`."""
        return {
            "url": ",".join(mask_url(u) for u in self.amqp_urls),
            "vhost": self.vhost,
            "management_url": mask_url(self.resolved_management_url()),
            "ca_file": str(self.ca_file) if self.ca_file else None,
            "cert_file": str(self.cert_file) if self.cert_file else None,
            "key_file": str(self.key_file) if self.key_file else None,
            "tls_verify": self.tls_verify,
            "connect_timeout_s": self.connect_timeout_s,
            "keyring_file": str(self.keyring_file) if self.keyring_file else None,
            # the inline key ring holds the key material: only whether it is set
            "keyring": "***" if self.keyring is not None else None,
        }

    def keyring_sources(self) -> tuple[str | None, str | None]:
        """``(file, inline JSON)`` of the key ring, for ``rmqkit.crypto.load_keyring`` only:
        the inline text holds key material and must go nowhere else."""
        inline = self.keyring.get_secret_value() if self.keyring is not None else None
        return (str(self.keyring_file) if self.keyring_file else None, inline or None)


def _check_userinfo(url: str) -> None:
    """ValueError, the URL masked, if its user name or password was not percent-encoded."""
    problem = malformed_userinfo(url)
    if problem is not None:
        raise ValueError(f"{mask_url(url)} is malformed: {problem}")


def _check_port(url: str, example: str) -> None:
    try:
        _ = urlsplit(url).port  # raises on a bad one
    except ValueError:
        raise ValueError(
            f"{mask_url(url)} has a bad port (a number from 1 to 65535: {example})"
        ) from None


def load_settings(*, flags: bool = False, **overrides: Any) -> Settings:
    """Build settings; ``overrides`` (from flags) beat environment, ``.env`` and defaults.

    Raises ConfigError (exit 78) with one line naming the bad setting. ``flags``: the
    overrides were given on the command line (``--url``), so a bad one is a UsageError (64)
    naming the flag; a bad setting from the environment or ``.env`` stays a ConfigError.
    """
    from pydantic import ValidationError

    clean = {k: v for k, v in overrides.items() if v is not None}
    try:
        return Settings(**clean)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else None
        # pydantic words a validator's error "Value error, <ours>": the prefix says nothing.
        message = str(first["msg"]).removeprefix("Value error, ")
        if flags and field in clean:
            raise UsageError(f"--{field.replace('_', '-')}: {message}") from None
        name = "RMQKIT_" + field.upper() if field else "settings"
        raise ConfigError(f"{name}: {message}") from None
