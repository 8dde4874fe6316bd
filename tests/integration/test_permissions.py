"""docs/permissions.md's table, run: each command as a user with exactly the tag and the vhost
permissions the table names succeeds, and what it did is counted on the broker. With the
next tag down, the command fails with exit 77 naming the tag, never "check the user and
password". Runs on 3.10, 4.0 and 4.3: the management API's refusals differ between them."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import rmqkit.outbox
from rmqkit import headers as h
from rmqkit.settings import with_vhost
from tests import broker

pytestmark = pytest.mark.semantics("4.0", "4.3")

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "permissions.md"
ORDERS = ROOT / "topologies" / "orders.toml"
WORK, PARKING = "orders.work", "orders.work.parking"
PASSWORD = "least-privilege"
LOWER = {"management": "none", "policymaker": "management", "administrator": "policymaker"}
NEEDS = {  # what the error must name for a tag that is missing
    "management": "a management tag",
    "policymaker": "the policymaker tag",
    "administrator": "the administrator tag",
}


@dataclass
class Vhost:
    """The module's vhost, with orders.toml declared, and a place for per-test files."""

    name: str
    tmp: Path
    before: int = 0  # a queue's depth before the command ran
    made: str = ""  # what the command was to create (a queue prefix, a vhost)

    def depth(self, queue: str) -> int:
        return broker.depths(self.name, [queue])[queue] or 0

    def park(self, n: int = 1) -> list[str]:
        """Put ``n`` messages in the parking queue, as the consumer parks them; their ids."""
        ids = [uuid.uuid4().hex for _ in range(n)]
        headers = {h.PARK_REASON: "permanent", h.ORIGIN_QUEUE: WORK}
        broker.publish_with_ids(
            self.name, "", PARKING, [(i, b'{"id": 1}') for i in ids], lambda _: headers
        )
        return ids


@pytest.fixture(scope="module")
def vhost(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Vhost]:
    name = broker.create_vhost("perm")
    found = broker.cli("declare", str(ORDERS), vhost=name)
    assert found.returncode == 0, found.stderr
    yield Vhost(name, tmp_path_factory.mktemp("perm"))
    broker.delete_vhost(name)


@dataclass
class User:
    name: str
    tags: str
    vhost: str

    def env(self, vhost: str | None = None) -> dict[str, str]:
        url = with_vhost(
            f"amqp://{self.name}:{PASSWORD}@{broker.BASE_URL.split('@', 1)[1].split('/')[0]}/",
            vhost or self.vhost,
        )
        mgmt = broker.MGMT.replace("://", f"://{self.name}:{PASSWORD}@", 1)
        return {"RMQKIT_URL": url, "RMQKIT_MANAGEMENT_URL": mgmt}

    def cli(self, *args: str, **kwargs: str) -> subprocess.CompletedProcess[str]:
        stdin = kwargs.pop("stdin", None)
        env = {**broker.cli_env(), **self.env(), **kwargs}
        return subprocess.run(
            [sys.executable, "-m", "rmqkit", *args],
            capture_output=True,
            text=True,
            env=env,
            input=stdin,
            timeout=90,
            check=False,
            cwd=ROOT,
        )


@pytest.fixture
def make_user(vhost: Vhost) -> Iterator[Callable[..., User]]:
    made: list[str] = []

    def make(tags: str, configure: str | None, write: str = "", read: str = "") -> User:
        name = f"rmqkit-perm-{uuid.uuid4().hex[:8]}"
        body = {"password": PASSWORD, "tags": "" if tags == "none" else tags}
        broker.api("PUT", f"/users/{name}", json=body).raise_for_status()
        made.append(name)
        if configure is not None:
            perms = {"configure": configure, "write": write, "read": read}
            path = f"/permissions/{broker.q(vhost.name)}/{name}"
            broker.api("PUT", path, json=perms).raise_for_status()
        return User(name, tags, vhost.name)

    yield make
    for name in made:
        broker.api("DELETE", f"/users/{name}")


# --- the rows: what each command is run with, and what it must leave on the broker ------
@dataclass
class Row:
    """One row of the table: the command's name as the table gives it, the user's tag and
    permissions (regexes for this module's names), and how to run and check it."""

    command: str
    tag: str
    perms: tuple[str, str, str] | None
    run: Callable[[User, Vhost], subprocess.CompletedProcess[str]]
    check: Callable[[Vhost, subprocess.CompletedProcess[str]], None] = field(
        default=lambda v, r: None
    )


PARK_Q = r"^orders\.work\.parking$"
DEFAULT_X = r"^amq\.default$"


def _parked_then(*args: str) -> Callable[[User, Vhost], subprocess.CompletedProcess[str]]:
    def run(user: User, vhost: Vhost) -> subprocess.CompletedProcess[str]:
        ids = vhost.park()
        full = [a.replace("{id}", ids[0]) for a in args]
        return user.cli(*full)

    return run


def _list_check(vhost: Vhost, result: subprocess.CompletedProcess[str]) -> None:
    assert result.stdout.strip(), "nothing listed"


def _replay(user: User, vhost: Vhost) -> subprocess.CompletedProcess[str]:
    vhost.before = vhost.depth(WORK)
    (parked,) = vhost.park()
    return user.cli("parking", "replay", PARKING, "--id", parked)


def _replay_check(vhost: Vhost, result: subprocess.CompletedProcess[str]) -> None:
    assert broker.wait_for(lambda: vhost.depth(WORK) == vhost.before + 1)


def _purge(user: User, vhost: Vhost) -> subprocess.CompletedProcess[str]:
    vhost.before = vhost.depth(PARKING)
    (parked,) = vhost.park()
    return user.cli("parking", "purge", PARKING, "--id", parked, "--yes")


def _purge_check(vhost: Vhost, result: subprocess.CompletedProcess[str]) -> None:
    assert vhost.depth(PARKING) == vhost.before


def _import(user: User, vhost: Vhost) -> subprocess.CompletedProcess[str]:
    (parked,) = vhost.park()
    export = vhost.tmp / f"{parked}.ndjson"
    made = broker.cli(
        "parking", "export", PARKING, "--id", parked, "-o", str(export), vhost=vhost.name
    )
    assert made.returncode == 0, made.stderr
    vhost.before = vhost.depth(PARKING)
    return user.cli("parking", "import", str(export), PARKING, "--again")


def _publish(user: User, vhost: Vhost) -> subprocess.CompletedProcess[str]:
    vhost.before = vhost.depth(WORK)
    return user.cli("publish", "orders", "order.created", "--random-ids", stdin='{"id": 7}\n')


def _relay(user: User, vhost: Vhost) -> subprocess.CompletedProcess[str]:
    dsn = f"sqlite:///{vhost.tmp}/outbox-{uuid.uuid4().hex[:6]}.db"
    rmqkit.outbox.init(dsn)
    with sqlite3.connect(dsn.removeprefix("sqlite:///")) as conn:
        rmqkit.outbox.add(conn, exchange="orders", routing_key="order.created", body={"n": 1})
    vhost.before = vhost.depth(WORK)
    return user.cli("outbox", "relay", "--dsn", dsn, "--once")


def _one_more_in_work(vhost: Vhost, result: subprocess.CompletedProcess[str]) -> None:
    assert broker.wait_for(lambda: vhost.depth(WORK) == vhost.before + 1)


def _one_more_parked(vhost: Vhost, result: subprocess.CompletedProcess[str]) -> None:
    assert broker.wait_for(lambda: vhost.depth(PARKING) == vhost.before + 1)


def _consume(user: User, vhost: Vhost) -> subprocess.CompletedProcess[str]:
    """A poison message (parked: a publish to the parking queue) and a failing one (retried:
    a publish to a wait queue); both through amq.default, then SIGTERM."""
    broker.drain(vhost.name, WORK)
    vhost.before = vhost.depth(PARKING)
    bodies = [b'{"id": "p", "permanent": true}', b'{"id": "f", "fail": 1}']
    broker.publish(vhost.name, "orders", "order.created", bodies)
    env = {
        **broker.cli_env(),
        **user.env(),
        "RMQKIT_TEST_LEDGER": str(vhost.tmp / f"ledger-{uuid.uuid4().hex[:6]}.db"),
    }
    args = ["consume", "-q", WORK, "-t", str(ORDERS), "tests.handlers:handle", "--grace", "5s"]
    with subprocess.Popen(
        [sys.executable, "-m", "rmqkit", *args],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        # Done when the poison one is parked and the failing one came back and was acked.
        settled = broker.wait_for(
            lambda: (
                proc.poll() is not None
                or (
                    vhost.depth(PARKING) == vhost.before + 1
                    and _effects(env["RMQKIT_TEST_LEDGER"]) == 1
                )
            ),
            timeout_s=30,
        )
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert settled
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def _effects(ledger: str) -> int:
    if not os.path.exists(ledger):
        return 0
    with sqlite3.connect(ledger) as db:
        try:
            return int(db.execute("SELECT count(*) FROM events WHERE kind='effect'").fetchone()[0])
        except sqlite3.OperationalError:
            return 0


def _consume_check(vhost: Vhost, result: subprocess.CompletedProcess[str]) -> None:
    assert vhost.depth(WORK) == 0
    assert vhost.depth(PARKING) == vhost.before + 1


def _declare(user: User, vhost: Vhost) -> subprocess.CompletedProcess[str]:
    prefix = user.name.removeprefix("rmqkit-perm-")
    topology = vhost.tmp / f"{prefix}.toml"
    topology.write_text(f'[queues."p{prefix}.work"]\nretry_delays = ["1s"]\n')
    vhost.made = prefix
    return user.cli("declare", str(topology))


def _declare_check(vhost: Vhost, result: subprocess.CompletedProcess[str]) -> None:
    prefix = vhost.made
    assert {f"p{prefix}.work", f"p{prefix}.work.parking"} <= broker.queue_names(vhost.name)


def _create_vhost(user: User, vhost: Vhost) -> subprocess.CompletedProcess[str]:
    fresh = f"rmqkit-test-permv-{uuid.uuid4().hex[:6]}"
    vhost.made = fresh
    topology = vhost.tmp / f"{fresh}.toml"
    topology.write_text('[queues."fresh.work"]\nretry_delays = ["1s"]\n')
    return user.cli(
        "declare", "--create-vhost", str(topology), RMQKIT_URL=user.env(fresh)["RMQKIT_URL"]
    )


def _create_vhost_check(vhost: Vhost, result: subprocess.CompletedProcess[str]) -> None:
    fresh = vhost.made
    try:
        assert {"fresh.work", "fresh.work.parking"} <= broker.queue_names(fresh)
    finally:
        broker.delete_vhost(fresh)


def _offline(user: User, vhost: Vhost) -> subprocess.CompletedProcess[str]:
    return user.cli("export", str(ORDERS), "--broker-version", "4.1")


def _preflight(user: User, vhost: Vhost) -> subprocess.CompletedProcess[str]:
    """`doctor --target 4.3`, succeeded when it ran every check it may: before 4.2 the upgrade
    path itself is a critical finding (exit 2), and khepri_db on 4.0 too."""
    done = user.cli("doctor", "--target", "4.3", "--json", "--topology", str(ORDERS))
    if done.returncode == 2:
        report = json.loads(done.stdout)
        if {f["check"] for f in report["findings"]} <= {"upgrade-path", "feature-flags"}:
            return subprocess.CompletedProcess(done.args, 0, done.stdout, done.stderr)
    return done


NOTHING = ("", "", "")
ROWS = [
    Row("`config`, `export`, `init`, `completion`, `keys`", "none", None, _offline),
    Row("`plan`", "management", NOTHING, lambda u, v: u.cli("plan", str(ORDERS))),
    Row("`status`", "management", NOTHING, lambda u, v: u.cli("status")),
    Row("`doctor`", "management", NOTHING, lambda u, v: u.cli("doctor")),
    Row("`doctor --target 4.3`", "management", NOTHING, _preflight),
    Row(
        "`parking list`, `show`, `stats`, `groups`, `export`",
        "management",
        ("", "", PARK_Q),
        _parked_then("parking", "list", PARKING),
        _list_check,
    ),
    Row(
        "`parking list`, `show`, `stats`, `groups`, `export`",
        "management",
        ("", "", PARK_Q),
        _parked_then("parking", "show", PARKING, "{id}"),
    ),
    Row(
        "`parking list`, `show`, `stats`, `groups`, `export`",
        "management",
        ("", "", PARK_Q),
        _parked_then("parking", "stats", PARKING),
    ),
    Row(
        "`parking list`, `show`, `stats`, `groups`, `export`",
        "management",
        ("", "", PARK_Q),
        _parked_then("parking", "export", PARKING),
    ),
    Row(
        "`parking list`, `show`, `stats`, `groups`, `export`",
        "management",
        ("", "", PARK_Q),
        _parked_then("parking", "groups", PARKING),
    ),
    Row("`parking purge`", "management", ("", "", PARK_Q), _purge, _purge_check),
    Row("`parking replay`", "management", ("", DEFAULT_X, PARK_Q), _replay, _replay_check),
    Row("`parking import`", "management", ("", DEFAULT_X, ""), _import, _one_more_parked),
    Row("`publish`", "none", ("", "^orders$", ""), _publish, _one_more_in_work),
    Row("`outbox relay`", "none", ("", "^orders$", ""), _relay, _one_more_in_work),
    Row("`consume`", "none", ("", DEFAULT_X, r"^orders\.work"), _consume, _consume_check),
    Row("`declare`", "policymaker", ("^p", "^p", "^p"), _declare, _declare_check),
    Row("`declare --create-vhost`", "administrator", None, _create_vhost, _create_vhost_check),
]


def _id(row: Row) -> str:
    command = row.command.split(",")[0].strip("`")
    if row.run.__name__ == "run":  # one of the parking views
        command += f"-{ROWS.index(row)}"
    return command.replace(" ", "-")


def _table() -> dict[str, tuple[str, ...]]:
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[0].startswith("`"):
            rows[cells[0]] = tuple(cells[1:5])
    return rows


def test_the_doc_table_and_these_rows_agree() -> None:
    table = _table()
    assert set(table) == {row.command for row in ROWS}
    for row in ROWS:
        assert table[row.command][0] == row.tag, row.command
        if row.perms is None:
            assert table[row.command][1:] == ("none",) * 3, row.command


@pytest.mark.parametrize("row", ROWS, ids=_id)
def test_the_least_the_table_names_suffices(
    row: Row, vhost: Vhost, make_user: Callable[..., User]
) -> None:
    perms = row.perms
    user = make_user(row.tag, *(perms if perms is not None else (None,)))
    result = row.run(user, vhost)
    assert result.returncode == 0, result.stdout[-500:] + result.stderr[-1500:]
    row.check(vhost, result)


@pytest.mark.parametrize(
    "row", [r for r in ROWS if r.tag in LOWER and r.run is not _consume], ids=_id
)
def test_one_tag_less_is_refused_naming_the_tag(
    row: Row, vhost: Vhost, make_user: Callable[..., User]
) -> None:
    perms = row.perms
    user = make_user(LOWER[row.tag], *(perms if perms is not None else (None,)))
    result = row.run(user, vhost)
    assert result.returncode == 77, result.stdout[-500:] + result.stderr[-1500:]
    line = result.stderr.strip().splitlines()[-1]
    assert NEEDS[row.tag] in line, line
    assert "check the user and password" not in line and PASSWORD not in line, line
    assert re.match(r"rmqkit: error: ", line), line


def test_a_failed_login_is_the_only_refusal_that_says_check_the_password(
    make_user: Callable[..., User],
) -> None:
    user = make_user("monitoring", "", "", ".*")
    wrong = User(user.name, user.tags, user.vhost)
    env = wrong.env()
    env["RMQKIT_MANAGEMENT_URL"] = env["RMQKIT_MANAGEMENT_URL"].replace(PASSWORD, "wrong")
    result = wrong.cli("status", **env)
    assert result.returncode == 77, result.stderr
    assert "check the user and password" in result.stderr and "wrong" not in result.stderr
    # The same user with its right password reads everything status needs.
    right = user.cli("status", "--json")
    assert right.returncode == 0, right.stderr
    assert json.loads(right.stdout)


def test_a_consumer_without_write_stops_instead_of_spending_deliveries(
    vhost: Vhost, make_user: Callable[..., User]
) -> None:
    """Read alone: the first retry's publish is refused. Reconnecting would redeliver the
    message each time until its delivery limit parked it; the consumer stops with 77 and
    the message is back on the work queue, with one delivery spent."""
    broker.drain(vhost.name, WORK)
    parked = vhost.depth(PARKING)
    user = make_user("none", "", "", r"^orders\.work$")
    broker.publish(vhost.name, "orders", "order.created", [b'{"id": "f", "fail": 1}'])
    result = user.cli(
        "consume",
        "-q",
        WORK,
        "-t",
        str(ORDERS),
        "tests.handlers:handle",
        RMQKIT_TEST_LEDGER=str(vhost.tmp / "l.db"),
    )
    assert result.returncode == 77, result.stderr[-2000:]
    assert "ACCESS_REFUSED" in result.stderr and "docs/permissions.md" in result.stderr
    assert "reconnecting" not in result.stderr
    assert broker.wait_for(lambda: vhost.depth(WORK) == 1)
    assert vhost.depth(PARKING) == parked  # nothing parked by the refusal
