"""The README's first Quickstart command, `scripts/demo`, run as a user would (its own vhost)."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from tests import broker

pytestmark = pytest.mark.semantics("4.3")

ROOT = Path(__file__).resolve().parents[2]


def test_scripts_demo_runs_the_main_job_end_to_end() -> None:
    vhost = f"rmqkit-test-demo-{uuid.uuid4().hex[:6]}"
    env = broker.cli_env()  # the broker under test; scripts/demo appends its vhost
    env["RMQKIT_DEMO_VHOST"] = vhost
    try:
        result = subprocess.run(
            ["bash", "scripts/demo"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        output = result.stdout + result.stderr
        assert result.returncode == 0, output
        assert "the consumer stopped cleanly (exit 0)" in output
        # Where everything went: two processed, two parked with their reason, nothing waiting.
        depths = broker.depths(vhost, broker.queue_names(vhost))
        assert depths.pop("orders.work.parking") == 2, depths
        assert not any(depths.values()), depths
        reasons = sorted(
            m["headers"]["rmqkit-park-reason"] for m in broker.drain(vhost, "orders.work.parking")
        )
        assert reasons == ["permanent", "undecodable"]
    finally:
        broker.delete_vhost(vhost)
