"""Ctrl-C during `parking purge` says what was done (issue 14, finding 5): exit 130 and
"interrupted: purged N message(s) … so far; the rest stay parked", N being what the broker
no longer holds — not a bare "interrupted" after which the operator cannot tell how much of
the lane is gone. (That Ctrl-C is never ignored: tests/integration/test_oncall_adversarial.py.)"""

from __future__ import annotations

import re
import time
from typing import Any

from tests.integration.test_oncall_adversarial import (
    PARKING,
    _depth,
    _interrupt,
    _orders_vhost,
    _park,
)

LANE = 12_000  # a purge of this many takes ~2 s here: Ctrl-C lands well inside it


def test_an_interrupted_purge_says_how_many_it_removed(fresh_vhost: Any) -> None:
    vhost = _orders_vhost(fresh_vhost)
    _park(vhost, LANE)
    for delay_s in (0.4, 0.2, 0.8):
        signalled, code, _out, err = _interrupt(
            vhost, delay_s, "parking", "purge", PARKING, "--yes"
        )
        if signalled:
            break
    assert signalled, "no purge lasted long enough to be interrupted"
    assert code == 130, err
    found = re.search(
        r"interrupted: purged (\d+) message\(s\) from 'orders.work.parking' so far", err
    )
    assert found, err
    assert "the rest stay parked" in err
    assert len(err.strip().splitlines()) == 1, err
    said = int(found.group(1))
    assert said < LANE
    # Returned messages land asynchronously (quorum queue): wait for the count to settle.
    deadline = time.monotonic() + 15
    while _depth(vhost) != LANE - said and time.monotonic() < deadline:
        time.sleep(0.25)
    assert _depth(vhost) == LANE - said
