"""`rmqkit config` says where each setting came from: a flag, an environment variable, the
.env file (its path), or the default — through the real entry point, in a directory with its
own .env, credentials masked wherever they came from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_config(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RMQKIT_")}
    return subprocess.run(
        [sys.executable, "-m", "rmqkit", *args],
        capture_output=True,
        text=True,
        env={**base, "PYTHONPATH": str(ROOT), "COLUMNS": "200", **env},
        cwd=cwd,
        timeout=60,
        check=False,
    )


def test_config_names_each_settings_source(tmp_path: Path) -> None:
    dotenv = tmp_path / ".env"
    dotenv.write_text(
        "RMQKIT_URL=amqp://ann:hunter2@dotenv-host/orders\nRMQKIT_CONNECT_TIMEOUT_S=7\n"
    )
    env = {"RMQKIT_TLS_VERIFY": "false"}
    shown = run_config(tmp_path, "config", "--json", **env)
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    where = f"{dotenv.resolve()} (RMQKIT_URL)"
    assert data["sources"] == {
        "url": where,
        "vhost": f"the url's path (url: {where})",
        "management_url": f"derived from the url (url: {where})",
        "ca_file": "default",
        "cert_file": "default",
        "key_file": "default",
        "tls_verify": "env RMQKIT_TLS_VERIFY",
        "connect_timeout_s": f"{dotenv.resolve()} (RMQKIT_CONNECT_TIMEOUT_S)",
        "keyring_file": "default",
        "keyring": "default",
        "keyring_keys": "default",
    }
    assert (data["url"], data["tls_verify"], data["connect_timeout_s"]) == (
        "amqp://ann:***@dotenv-host/orders",
        False,
        7.0,
    )
    # a flag beats the environment and .env, and says so
    flagged = run_config(
        tmp_path, "--url", "amqp://bob:s3cret@flag-host/v", "config", "--vhost", "other", **env
    )
    assert flagged.returncode == 0, flagged.stderr
    lines = flagged.stdout.splitlines()
    assert "url = amqp://bob:***@flag-host/other  # --url" in lines, lines
    assert "vhost = other  # --vhost" in lines, lines
    assert "tls_verify = False  # env RMQKIT_TLS_VERIFY" in lines, lines
    assert f"connect_timeout_s = 7.0  # {dotenv.resolve()} (RMQKIT_CONNECT_TIMEOUT_S)" in lines
    assert "ca_file = None  # default" in lines
    for out in (shown, flagged):
        assert "hunter2" not in out.stdout + out.stderr
        assert "s3cret" not in out.stdout + out.stderr
