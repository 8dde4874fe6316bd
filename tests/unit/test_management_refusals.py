"""What a management API 401 says is missing, by the reason RabbitMQ gives (3.10 to 4.3):
only a failed login is "check the user and password"."""

from __future__ import annotations

import pytest

from rmqkit.broker.management import missing_for


@pytest.mark.parametrize(
    ("reason", "path", "needs"),
    [
        ("Not administrator user", "/vhosts/v", "the administrator tag"),
        ("Not monitor user", "/nodes", "the monitoring tag"),
        ("Not management user", "/overview", "a management tag"),
        ("User not authorised to access virtual host", "/queues/v", "permissions on vhost 'v'"),
        ("User not authorised to access object", "/policies/v/p", "the policymaker tag"),
        ("User not authorised to access object", "/queues/v/q", "permissions on this object"),
    ],
)
def test_each_reason_names_what_is_missing(reason: str, path: str, needs: str) -> None:
    found = missing_for(reason, path, "v")
    assert found is not None and found.startswith(needs), found


@pytest.mark.parametrize("reason", ["Login failed", "Not_Authorized", "something new"])
def test_a_failed_or_unknown_reason_names_nothing(reason: str) -> None:
    # The client then asks /api/whoami: a 200 means the login is good (a permission is
    # missing), a refusal that the login failed.
    assert missing_for(reason, "/overview", "v") is None
