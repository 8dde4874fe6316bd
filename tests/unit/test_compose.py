"""docker-compose.yml stays in step with rmqkit's settings defaults.

The file is only parsed here (no Docker engine is needed): a user who runs `docker compose up`
must get a broker that `rmqkit` reaches with no configuration at all.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, unquote, urlsplit

import pytest
import yaml

from rmqkit.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"


@pytest.fixture
def service() -> dict[str, Any]:
    compose = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    rabbitmq: dict[str, Any] = compose["services"]["rabbitmq"]
    return rabbitmq


@pytest.fixture
def defaults(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Settings:
    """The settings defaults, whatever RMQKIT_* variables or .env the test machine has."""
    for name in list(os.environ):
        if name.upper().startswith("RMQKIT_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)  # no .env here
    return Settings()


def published(service: dict[str, Any]) -> dict[int, tuple[str | None, int]]:
    """Container port -> (host IP or None, host port), from short or long port syntax."""
    result: dict[int, tuple[str | None, int]] = {}
    for port in service.get("ports", []):
        if isinstance(port, dict):
            result[int(port["target"])] = (port.get("host_ip"), int(port["published"]))
            continue
        match = re.fullmatch(r"(?:(?P<ip>[^:]+):)?(?P<host>\d+):(?P<target>\d+)(?:/tcp)?", port)
        assert match, f"unexpected port entry {port!r}"
        result[int(match["target"])] = (match["ip"], int(match["host"]))
    return result


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {key: str(value) for key, value in env.items()}


def amqp_default(defaults: Settings) -> SplitResult:
    return urlsplit(defaults.amqp_urls[0])


def test_image_is_rabbitmq_4_with_management(service: dict[str, Any]) -> None:
    assert re.fullmatch(r"rabbitmq:4(\.\d+)*-management(-alpine)?", service["image"])


def test_image_is_a_version_ci_tests(service: dict[str, Any]) -> None:
    """Users of docker compose get a broker the suite runs on (.ci/run: 3.10, 4.0, 4.3)."""
    tested = re.findall(r"--version (\d+\.\d+)", (ROOT / ".ci" / "run").read_text())
    tested += re.findall(r"for version in ([\d. ]+);", (ROOT / ".ci" / "run").read_text())
    versions = {v for group in tested for v in group.split()}
    minor = re.match(r"rabbitmq:(\d+\.\d+)", service["image"])
    assert minor is not None and minor.group(1) in versions, (service["image"], versions)


def test_ports_publish_the_default_amqp_and_management_ports(
    service: dict[str, Any], defaults: Settings
) -> None:
    amqp = amqp_default(defaults)
    management = urlsplit(defaults.resolved_management_url())
    ports = published(service)
    assert ports[5672][1] == amqp.port == 5672
    assert ports[15672][1] == management.port == 15672
    for host_ip, _ in ports.values():
        # The default host must reach the published port.
        assert host_ip in (None, "0.0.0.0", amqp.hostname)


def test_credentials_are_the_settings_defaults(service: dict[str, Any], defaults: Settings) -> None:
    env = environment(service)
    user = env.get("RABBITMQ_DEFAULT_USER", "guest")  # the broker's own default
    password = env.get("RABBITMQ_DEFAULT_PASS", "guest")
    for url in (amqp_default(defaults), urlsplit(defaults.resolved_management_url())):
        assert (unquote(url.username or ""), unquote(url.password or "")) == (user, password)
    assert amqp_default(defaults).path in ("", "/")  # the default vhost, which the image creates


def test_healthcheck_probes_the_broker(service: dict[str, Any]) -> None:
    check = service["healthcheck"]
    test = check["test"]
    command = " ".join(test[1:] if isinstance(test, list) else [test])
    assert "rabbitmq-diagnostics" in command
    assert re.search(r"\b(ping|check_port_connectivity|check_running)\b", command)
    for key in ("interval", "timeout", "retries"):
        assert key in check


def test_data_lives_in_a_named_volume(service: dict[str, Any]) -> None:
    compose = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    mounts = [v for v in service.get("volumes", []) if isinstance(v, str)]
    named = {m.split(":", 1)[0] for m in mounts if m.endswith(":/var/lib/rabbitmq")}
    assert named and named <= set(compose.get("volumes") or {})
