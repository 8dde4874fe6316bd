"""Queue and vhost names complete from the broker, the way the shell asks (``_RMQKIT_COMPLETE``
set, the words in ``COMP_WORDS``), for the vhost the command line names."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from tests import broker

RMQKIT = Path(sys.executable).parent / "rmqkit"


def complete(vhost: str | None, words: str) -> subprocess.CompletedProcess[str]:
    env = {
        **broker.cli_env(vhost),
        "COMP_WORDS": words,
        "COMP_CWORD": str(len(words.split()) - 1),
        "_RMQKIT_COMPLETE": "bash_complete",
    }
    return subprocess.run(
        [str(RMQKIT)], capture_output=True, text=True, env=env, cwd="/", timeout=60, check=False
    )


def test_queue_names_complete_from_the_vhost(fresh_vhost: Any) -> None:
    vhost, other = fresh_vhost(), fresh_vhost()
    for name in ("cmp.alpha.work", "cmp.alpha.work.parking", "cmp.beta.work"):
        body = {"durable": True, "arguments": {"x-queue-type": "quorum"}}
        broker.api("PUT", f"/queues/{broker.q(vhost)}/{name}", json=body).raise_for_status()
    broker.api(
        "PUT", f"/queues/{broker.q(other)}/cmp.alpha.elsewhere", json={"durable": True}
    ).raise_for_status()
    done = complete(vhost, "rmqkit parking list cmp.al")
    assert (done.returncode, done.stderr) == (0, ""), done
    assert done.stdout.split() == ["cmp.alpha.work", "cmp.alpha.work.parking"]
    # --vhost on the command line (after the command) picks the vhost whose queues complete
    after = complete(vhost, f"rmqkit parking list --vhost {other} --origin cmp.")
    assert after.stdout.split() == ["cmp.alpha.elsewhere"], after
    work = complete(vhost, "rmqkit parking stats --queue cmp.b")
    assert work.stdout.split() == ["cmp.beta.work"], work
    vhosts = complete(vhost, f"rmqkit --vhost {vhost[:-3]}")
    assert vhost in vhosts.stdout.split(), vhosts
    # completing reads names only: the queues are as they were
    assert broker.depths(vhost, ["cmp.alpha.work"]) == {"cmp.alpha.work": 0}
