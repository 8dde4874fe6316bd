from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rmqkit.crypto import generate, rotate
from rmqkit.errors import ConfigError, ExitCode
from rmqkit.settings import load_settings, mask_url, vhost_of, with_vhost

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in (
        "RMQKIT_URL",
        "RMQKIT_MANAGEMENT_URL",
        "RMQKIT_CONNECT_TIMEOUT_S",
        "RMQKIT_KEYRING_FILE",
        "RMQKIT_KEYRING",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


def test_defaults() -> None:
    settings = load_settings()
    assert settings.amqp_urls == ["amqp://guest:guest@127.0.0.1:5672/"]
    assert settings.vhost == "/"
    assert settings.resolved_management_url() == "http://guest:guest@127.0.0.1:15672"


def test_precedence_flag_env_dotenv_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / ".env").write_text(
        "RMQKIT_URL=amqp://u:p@dotenv:5672/a\nRMQKIT_CONNECT_TIMEOUT_S=7\n"
    )
    assert load_settings().amqp_urls == ["amqp://u:p@dotenv:5672/a"]
    assert load_settings().connect_timeout_s == 7
    monkeypatch.setenv("RMQKIT_URL", "amqp://u:p@env:5672/b")
    assert load_settings().amqp_urls == ["amqp://u:p@env:5672/b"]
    assert load_settings(url="amqp://u:p@flag:5672/c").amqp_urls == ["amqp://u:p@flag:5672/c"]
    assert load_settings(url=None).amqp_urls == ["amqp://u:p@env:5672/b"]


def test_cluster_urls_and_encoded_vhost() -> None:
    settings = load_settings(url="amqp://u:p%40ss@a:5681/my%2Fvh, amqp://u:p%40ss@b:5682/my%2Fvh")
    assert [u.split("@")[1] for u in settings.amqp_urls] == ["a:5681/my%2Fvh", "b:5682/my%2Fvh"]
    assert settings.vhost == "my/vh"
    assert settings.resolved_management_url() == "http://u:p%40ss@a:15672"


def test_tls_url_derives_https_management() -> None:
    settings = load_settings(url="amqps://u:p@broker.example:5671/")
    assert settings.uses_tls
    assert settings.resolved_management_url() == "https://u:p@broker.example:15671"
    assert settings.ssl_context() is not None


def test_missing_tls_files_are_a_config_error() -> None:
    settings = load_settings(url="amqps://u:p@h/", ca_file="/nonexistent/ca.pem")
    with pytest.raises(ConfigError, match="RMQKIT_CA_FILE"):
        settings.ssl_context()


def test_management_url_without_credentials_borrows_the_amqp_ones() -> None:
    settings = load_settings(url="amqp://me:pw@h/", management_url="https://mgmt:443")
    assert settings.resolved_management_url() == "https://me:pw@mgmt:443"


@pytest.mark.parametrize("url", ["http://x", "amqp://", "", "amqp://a/v1,amqp://b/v2"])
def test_bad_urls_are_config_errors(url: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(url=url)
    assert info.value.exit_code == ExitCode.CONFIG == 78
    assert "RMQKIT_URL" in str(info.value)


def test_masking_never_shows_the_password() -> None:
    settings = load_settings(url="amqp://user:s3cret@h:5672/v")
    shown = str(settings.masked())
    assert "s3cret" not in shown and "user:***@h:5672" in shown
    assert "s3cret" not in repr(settings)
    assert mask_url("amqp://h/") == "amqp://h/"


def test_vhost_helpers() -> None:
    assert vhost_of("amqp://h") == "/" and vhost_of("amqp://h/%2F") == "/"
    assert vhost_of(with_vhost("amqp://u:p@h:1/", "a/b")) == "a/b"


# --- the key ring settings (issue 16) ----------------------------------------------------------
def _materials(text: str) -> list[str]:
    data = json.loads(text)
    return [k["key"] for k in data["keys"]] + [data["index_key"]["key"]]


def _rmqkit_config(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`python -m rmqkit config ARGS` in ``tmp_path`` (its .env) with only ``env``'s RMQKIT_*."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("RMQKIT_")}
    return subprocess.run(
        [sys.executable, "-m", "rmqkit", "config", *args],
        capture_output=True,
        text=True,
        env={**base, "PYTHONPATH": str(ROOT), **env},
        cwd=tmp_path,
        timeout=60,
        check=False,
    )


def test_keyring_settings_from_env_and_dotenv(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    settings = load_settings()
    assert settings.keyring_file is None and settings.keyring is None
    assert settings.keyring_sources() == (None, None)
    (tmp_path / ".env").write_text("RMQKIT_KEYRING_FILE=/etc/rmqkit/ring.json\n")
    assert load_settings().keyring_file == Path("/etc/rmqkit/ring.json")
    monkeypatch.setenv("RMQKIT_KEYRING", '{"inline": "SECRETMATERIAL"}')
    settings = load_settings()
    assert settings.keyring_sources() == ("/etc/rmqkit/ring.json", '{"inline": "SECRETMATERIAL"}')
    shown = str(settings.masked()) + repr(settings) + str(settings)
    assert "SECRETMATERIAL" not in shown
    assert settings.masked()["keyring"] == "***"
    monkeypatch.setenv("RMQKIT_KEYRING_FILE", "")  # empty: unset, not Path(".")
    assert load_settings().keyring_file is None


def test_config_shows_key_ids_never_material(tmp_path: Path) -> None:
    ring = generate(tmp_path / "ring.json")
    ring = rotate(tmp_path / "ring.json")[0]
    text = (tmp_path / "ring.json").read_text()
    secrets = _materials(text)
    assert len(ring.key_ids) == 2
    # from a file named in .env
    (tmp_path / ".env").write_text(f"RMQKIT_KEYRING_FILE={tmp_path / 'ring.json'}\n")
    shown = _rmqkit_config(tmp_path, "--json")
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert data["keyring_keys"]["current"] == ring.current_id
    assert [k["id"] for k in data["keyring_keys"]["keys"]] == ring.key_ids
    assert [k["current"] for k in data["keyring_keys"]["keys"]] == [False, True]
    assert data["keyring_file"] == str(tmp_path / "ring.json") and data["keyring"] is None
    # inline, in the environment (the .env file gone): the JSON is never echoed
    (tmp_path / ".env").unlink()
    plain = _rmqkit_config(tmp_path, RMQKIT_KEYRING=text)
    assert plain.returncode == 0, plain.stderr
    assert f"{ring.current_id} (current)" in plain.stdout
    assert ring.key_ids[0] in plain.stdout and ring.index_key.id in plain.stdout
    as_json = _rmqkit_config(tmp_path, "--json", RMQKIT_KEYRING=text)
    everything = shown.stdout + shown.stderr + plain.stdout + plain.stderr + as_json.stdout
    for secret in secrets:
        assert secret not in everything
    assert '"format"' not in plain.stdout and json.loads(as_json.stdout)["keyring"] == "***"
    # both at once: a configuration error, one line, exit 78
    both = _rmqkit_config(
        tmp_path, RMQKIT_KEYRING=text, RMQKIT_KEYRING_FILE=str(tmp_path / "ring.json")
    )
    assert both.returncode == 78 and len(both.stderr.strip().splitlines()) == 1
    for secret in secrets:
        assert secret not in both.stderr
