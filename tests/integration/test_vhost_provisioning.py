"""A fresh environment in one command: `rmqkit declare --create-vhost` with the file's
``[vhost.permissions]``, `plan` showing them, and a refused vhost naming the ones the user can
see. Counted on the broker: the vhost, its queues and every user's permissions as the
management API reports them afterwards."""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aio_pika
import aiormq
import pytest

from rmqkit.settings import with_vhost
from tests import broker

FILE = """
[vhost.permissions.{app}]
configure = "^payments"
write = "^payments"
read = "^payments"

[vhost.permissions.{mon}]
read = ".*"

[exchanges.payments]
type = "direct"

[queues."payments.work"]
bind = [{{ exchange = "payments", routing_key = "pay" }}]
retry_delays = ["1s"]
"""


@dataclass
class Env:
    """A vhost that does not exist yet, two users that do, and the file naming them."""

    vhost: str
    app: str
    mon: str
    file: Path

    def url(self, user: str = "guest", password: str = "guest") -> str:
        return with_vhost(f"amqp://{user}:{password}@{_hostport()}/", self.vhost)

    def cli(
        self, *args: str, user: str = "guest", password: str = "guest"
    ) -> subprocess.CompletedProcess[str]:
        return broker.cli(*args, env={"RMQKIT_URL": self.url(user, password)})

    def permissions(self) -> dict[str, dict[str, str]]:
        response = broker.api("GET", f"/vhosts/{broker.q(self.vhost)}/permissions")
        response.raise_for_status()
        return {
            row["user"]: {k: row[k] for k in ("configure", "write", "read")}
            for row in response.json()
        }

    def exists(self) -> bool:
        return broker.api("GET", f"/vhosts/{broker.q(self.vhost)}").status_code == 200


def _hostport() -> str:
    return broker.BASE_URL.split("@", 1)[1].split("/", 1)[0]


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    tag = uuid.uuid4().hex[:6]
    found = Env(f"rmqkit-test-prov-{tag}", f"rmqkit-app-{tag}", f"rmqkit-mon-{tag}", Path())
    # management: the app sees only the vhosts it has permissions on (monitoring sees all)
    for user, tags in ((found.app, "management"), (found.mon, "monitoring")):
        body = {"password": "secret", "tags": tags}
        broker.api("PUT", f"/users/{user}", json=body).raise_for_status()
    found.file = tmp_path / "payments.toml"
    found.file.write_text(FILE.format(app=found.app, mon=found.mon))
    yield found
    broker.delete_vhost(found.vhost)
    for user in (found.app, found.mon):
        broker.api("DELETE", f"/users/{user}")


FULL = {"configure": ".*", "write": ".*", "read": ".*"}


@pytest.mark.semantics("4.3")
def test_declare_create_vhost_makes_a_fresh_environment_in_one_command(env: Env) -> None:
    dry = env.cli("declare", "--create-vhost", "--dry-run", str(env.file))
    assert dry.returncode == 0, dry.stderr
    assert f"create    vhost    {env.vhost}" in dry.stdout
    assert f"create    permission {env.app} — configure '^payments'" in dry.stdout
    assert not env.exists(), "--dry-run created the vhost"

    done = env.cli("declare", "--create-vhost", str(env.file))
    assert done.returncode == 0, done.stderr
    assert env.exists()
    assert {"payments.work", "payments.work.parking", "payments.work.wait.1s"} <= (
        broker.queue_names(env.vhost)
    )
    patterns = {"configure": "^payments", "write": "^payments", "read": "^payments"}
    assert env.permissions() == {
        "guest": FULL,  # the declaring user, so it could declare
        env.app: patterns,
        env.mon: {"configure": "", "write": "", "read": ".*"},
    }

    plan = env.cli("plan", "--all", str(env.file))
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert f"in-sync   permission {env.app}" in plan.stdout
    again = env.cli("declare", "--create-vhost", str(env.file))
    assert again.returncode == 0 and "No changes" in again.stdout, again.stdout

    # The permissions work as granted: the app publishes to its exchange, reads its queue,
    # and may not configure anything outside ^payments.
    async def as_app() -> tuple[int, str]:
        conn = await aio_pika.connect(env.url(env.app, "secret"))
        async with conn:
            channel = await conn.channel()
            exchange = await channel.get_exchange("payments", ensure=False)
            await exchange.publish(aio_pika.Message(b"{}"), routing_key="pay")
            refused = ""
            try:
                other = await conn.channel()
                await other.declare_queue("other.work", durable=True)
            except aiormq.exceptions.ChannelAccessRefused as exc:
                refused = str(exc)
        return 0, refused

    _, refused = asyncio.run(as_app())
    assert "ACCESS_REFUSED" in refused
    assert broker.wait_for(lambda: broker.depths(env.vhost, ["payments.work"])["payments.work"])
    assert broker.depths(env.vhost, ["payments.work"]) == {"payments.work": 1}


def test_plan_shows_a_changed_pattern_and_declare_applies_it_leaving_others(env: Env) -> None:
    assert env.cli("declare", "--create-vhost", str(env.file)).returncode == 0
    # somebody else's grant, made by hand: declare must not touch it
    other = {"configure": "", "write": "", "read": "^audit"}
    broker.api("PUT", f"/permissions/{broker.q(env.vhost)}/{env.app}", json=other)
    broker.api(
        "PUT",
        f"/permissions/{broker.q(env.vhost)}/{env.mon}",
        json={"configure": "", "write": "", "read": "^payments"},
    )
    plan = env.cli("plan", str(env.file))
    assert plan.returncode == 2, plan.stdout + plan.stderr
    assert f"change    permission {env.mon} — read '^payments' → '.*'" in plan.stdout
    assert (
        f"change    permission {env.app} — configure '' → '^payments'; "
        "write '' → '^payments'; read '^audit' → '^payments'"
    ) in plan.stdout

    done = env.cli("declare", str(env.file))
    assert done.returncode == 0, done.stderr
    assert env.permissions()[env.mon] == {"configure": "", "write": "", "read": ".*"}
    assert env.permissions()[env.app]["read"] == "^payments"

    # a user the file does not name: shown as an orphan, left as it is
    stranger = f"{env.app}-x"
    broker.api("PUT", f"/users/{stranger}", json={"password": "p", "tags": ""})
    try:
        broker.api("PUT", f"/permissions/{broker.q(env.vhost)}/{stranger}", json=FULL)
        plan = env.cli("plan", str(env.file))
        assert f"orphan    permission {stranger}" in plan.stdout, plan.stdout
        assert env.cli("declare", str(env.file)).returncode == 0
        assert env.permissions()[stranger] == FULL
    finally:
        broker.api("DELETE", f"/users/{stranger}")


def test_a_user_that_does_not_exist_changes_nothing_not_even_the_vhost(env: Env) -> None:
    env.file.write_text(env.file.read_text() + '\n[vhost.permissions."nobody-here"]\nread = ".*"\n')
    result = env.cli("declare", "--create-vhost", str(env.file))
    assert result.returncode == 65, result.stdout + result.stderr
    assert "user 'nobody-here' does not exist" in result.stderr
    assert "nothing was changed" in result.stderr
    assert not env.exists()


def test_a_missing_vhost_names_the_vhosts_the_user_can_see(env: Env) -> None:
    for command in (("plan", str(env.file)), ("status",), ("declare", str(env.file))):
        result = env.cli(*command)
        assert result.returncode == 77, result.stdout + result.stderr
        line = result.stderr.strip()
        assert f"refused vhost {env.vhost!r}" in line and "can see: '/'" in line, line
        assert "--create-vhost" in line and "guest:***" in line and "guest:guest" not in line

    # A user that sees only its own vhost is told about that one alone.
    assert env.cli("declare", "--create-vhost", str(env.file)).returncode == 0
    elsewhere = Env(env.vhost + "-typo", env.app, env.mon, env.file)
    result = elsewhere.cli("status", user=env.app, password="secret")
    assert result.returncode == 77, result.stderr
    assert f"can see: {env.vhost!r} —" in result.stderr, result.stderr


def test_create_vhost_needs_an_administrator_and_says_so(env: Env) -> None:
    result = env.cli("declare", "--create-vhost", str(env.file), user=env.mon, password="secret")
    assert result.returncode == 77, result.stdout + result.stderr
    assert "needs the administrator tag" in result.stderr
    assert f"user {env.mon!r}" in result.stderr and "secret" not in result.stderr
    assert not env.exists()
