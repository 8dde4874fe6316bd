"""``[vhost.permissions]``: parsing, the union of several files, and plan's verdicts (pure; the
broker's side is tests/integration/test_vhost_provisioning.py)."""

from __future__ import annotations

import pytest

from rmqkit.errors import TopologyFileError
from rmqkit.topology.model import parse_topology
from rmqkit.topology.permissions import (
    LivePermissions,
    PermissionSpec,
    desired_permissions,
    permission_changes,
)

FILE = """
[vhost.permissions.app]
configure = "^payments\\\\."
write = "^payments\\\\."
read = "^payments\\\\."

[vhost.permissions.monitor]
read = ".*"

[queues."payments.work"]
"""


def test_a_user_table_names_exactly_what_it_grants() -> None:
    topology = parse_topology(FILE, "p.toml")
    specs = {s.user: s for s in desired_permissions([topology])}
    assert specs["app"].patterns() == {
        "configure": "^payments\\.",
        "write": "^payments\\.",
        "read": "^payments\\.",
    }
    # what a table leaves out grants nothing
    assert specs["monitor"].patterns() == {"configure": "", "write": "", "read": ".*"}


def test_a_bad_pattern_or_key_is_refused_with_its_line() -> None:
    with pytest.raises(TopologyFileError) as bad:
        parse_topology('[queues.q]\n\n[vhost.permissions.app]\nread = "(unclosed"\n', "t.toml")
    assert bad.value.line == 4 and "not a regular expression" in str(bad.value)
    with pytest.raises(TopologyFileError) as typo:
        parse_topology('[vhost.permissions.app]\nreed = ".*"\n', "t.toml")
    assert "unknown key" in str(typo.value) and typo.value.line == 2
    with pytest.raises(TopologyFileError) as number:
        parse_topology("[vhost.permissions.app]\nread = 1\n", "t.toml")
    assert "write it as a string" in str(number.value)


def test_two_files_must_agree_on_a_user() -> None:
    one = parse_topology('[vhost.permissions.app]\nread = ".*"\n', "a.toml")
    same = parse_topology('[vhost.permissions.app]\nread = ".*"\n', "b.toml")
    assert len(desired_permissions([one, same])) == 1
    other = parse_topology('[vhost.permissions.app]\nread = "^x"\n', "c.toml")
    with pytest.raises(TopologyFileError) as err:
        desired_permissions([one, other])
    assert "a.toml" in str(err.value) and "c.toml" in str(err.value)


def _spec(user: str, read: str = ".*") -> PermissionSpec:
    return PermissionSpec(user, "", "", read, "p.toml")


def test_plan_verdicts_for_each_user() -> None:
    live = LivePermissions(
        "admin",
        {
            "same": {"configure": "", "write": "", "read": ".*"},
            "moved": {"configure": "", "write": "", "read": ".*"},
            "stranger": {"configure": ".*", "write": ".*", "read": ".*"},
            "admin": {"configure": ".*", "write": ".*", "read": ".*"},
        },
        frozenset({"same", "moved", "new", "stranger", "admin"}),
    )
    changes = permission_changes(
        [_spec("same"), _spec("moved", "^orders"), _spec("new"), _spec("ghost")], live
    )
    verdicts = {c.name: (c.action, c.detail) for c in changes}
    assert verdicts["same"] == ("in-sync", "")
    assert verdicts["moved"] == ("change", "read '.*' → '^orders'")
    assert verdicts["new"][0] == "create"
    assert verdicts["ghost"][0] == "conflict" and "does not exist" in verdicts["ghost"][1]
    # a user the file does not name is left alone, but shown; the one declaring is not
    assert verdicts["stranger"][0] == "orphan" and "declare leaves it" in verdicts["stranger"][1]
    assert "admin" not in verdicts


def test_unreadable_permissions_are_pending_and_say_why() -> None:
    changes = permission_changes([_spec("app")], LivePermissions("mon", None, None))
    assert [(c.action, c.name) for c in changes] == [("change", "app")]
    assert "administrator tag" in changes[0].detail and "'mon'" in changes[0].detail
    assert permission_changes([], LivePermissions("mon", None, None)) == []
