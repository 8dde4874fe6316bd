from __future__ import annotations

from pathlib import Path

import pytest

from rmqkit.errors import ConfigError, ExitCode
from rmqkit.settings import load_settings, mask_url, vhost_of, with_vhost


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("RMQKIT_URL", "RMQKIT_MANAGEMENT_URL", "RMQKIT_CONNECT_TIMEOUT_S"):
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
