"""The key ring of field-level encryption (issue 16): file format, loading from the file or the
environment, generate/rotate/activate (0600, atomic, no silent overwrite), and key material
never showing in repr/str, errors or logs. Also the `rmqkit keys` commands (rmqkit.cli.keys).

On the code before rmqkit/crypto existed this module fails at import (no rmqkit.crypto).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rmqkit.cli.keys import app
from rmqkit.crypto import (
    KeyRing,
    KeyRingError,
    activate,
    decrypt_fields,
    encrypt_fields,
    generate,
    generate_keyring,
    keyring_from_env,
    load_keyring,
    load_keyring_file,
    parse_keyring,
    rotate,
)
from rmqkit.errors import ConfigError, ExitCode, UsageError


def _materials(path: Path) -> list[str]:
    data = json.loads(path.read_text())
    return [k["key"] for k in data["keys"]] + [data["index_key"]["key"]]


def _leaks(text: str, materials: list[str]) -> list[str]:
    """Material found in ``text``, as base64, as hex, or as the raw bytes' repr."""
    found = []
    for m in materials:
        raw = base64.b64decode(m)
        if m in text or raw.hex() in text or repr(raw)[2:-1] in text:
            found.append(m)
    return found


# --- file format and loading --------------------------------------------------------------------
def test_generate_writes_the_documented_format_with_mode_0600(tmp_path) -> None:
    path = tmp_path / "keys.json"
    old = os.umask(0o022)  # the usual umask would make any plain new file 0644
    try:
        ring = generate(path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    data = json.loads(path.read_text())
    assert data["format"] == "rmqkit-keyring/1"
    assert data["current"] == ring.current_id == data["keys"][0]["id"]
    assert len(data["keys"]) == 1 and data["index_key"]["id"] == ring.index_key.id
    for entry in [*data["keys"], data["index_key"]]:
        assert set(entry) == {"id", "created", "key"}
        assert len(base64.b64decode(entry["key"], validate=True)) == 32
        assert entry["created"].endswith("Z")
    assert data["keys"][0]["key"] != data["index_key"]["key"]
    assert not [p for p in tmp_path.iterdir() if p.name != "keys.json"]  # no temporary left


def test_generate_refuses_to_overwrite_without_force(tmp_path) -> None:
    path = tmp_path / "keys.json"
    generate(path)
    before = path.read_text()
    with pytest.raises(UsageError, match="--force"):
        generate(path)
    assert path.read_text() == before
    generate(path, force=True)
    assert path.read_text() != before and stat.S_IMODE(path.stat().st_mode) == 0o600


def test_rotate_adds_a_current_key_and_keeps_the_rest(tmp_path) -> None:
    path = tmp_path / "keys.json"
    first = generate(path)
    path.chmod(0o644)  # loosened by someone: rotation writes 0600 again
    sealed = encrypt_fields({"t": "x"}, ["t"], ["t"], first)
    _, key = rotate(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    loaded = load_keyring_file(path)
    assert loaded.key_ids == [first.current_id, key.id] and loaded.current_id == key.id
    assert loaded.index_key.id == first.index_key.id
    assert _materials(path)[-1] == json.loads(first.to_json())["index_key"]["key"]
    assert decrypt_fields(sealed, None, loaded) == {"t": "x"}
    assert encrypt_fields({"t": "x"}, ["t"], ["t"], loaded)["t"]["bi"] == sealed["t"]["bi"]
    staged, new = rotate(path, activate=False)
    assert load_keyring_file(path).current_id == key.id and new.id in staged.key_ids
    assert activate(path, new.id).current_id == new.id == load_keyring_file(path).current_id


def test_loading_from_the_environment(tmp_path, monkeypatch) -> None:
    path = tmp_path / "keys.json"
    ring = generate(path)
    assert keyring_from_env({}) is None
    assert keyring_from_env({"RMQKIT_KEYRING_FILE": str(path)}).current_id == ring.current_id
    inline = keyring_from_env({"RMQKIT_KEYRING": path.read_text()})
    assert inline.current_id == ring.current_id and inline.source == "RMQKIT_KEYRING"
    with pytest.raises(KeyRingError, match="not both"):
        keyring_from_env({"RMQKIT_KEYRING_FILE": str(path), "RMQKIT_KEYRING": "{}"})
    monkeypatch.setenv("RMQKIT_KEYRING_FILE", str(path))
    monkeypatch.delenv("RMQKIT_KEYRING", raising=False)
    assert keyring_from_env().current_id == ring.current_id
    with pytest.raises(KeyRingError, match="cannot read") as caught:
        load_keyring(tmp_path / "missing.json")
    assert caught.value.exit_code == ExitCode.CONFIG


def _variant(text: str, change) -> str:
    data = json.loads(text)
    change(data)
    return json.dumps(data)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda d: d.update(format="other"), "format"),
        (lambda d: d.update(keys=[]), "keys must be"),
        (lambda d: d.update(current="k-missing"), "current key"),
        (lambda d: d["keys"][0].update(key=d["keys"][0]["key"][:-1]), "not valid base64"),
        (lambda d: d["keys"][0].update(key=base64.b64encode(b"x" * 16).decode()), "16 bytes"),
        (lambda d: d["keys"][0].update(id="bad id"), "keys[0].id"),
        (lambda d: d["keys"].append(dict(d["keys"][0])), "twice"),
        (lambda d: d.pop("index_key"), "index_key"),
    ],
)
def test_a_bad_key_ring_is_a_one_line_error_without_material(change, words) -> None:
    text = generate_keyring().to_json()
    materials = [k["key"] for k in json.loads(text)["keys"]] + [
        json.loads(text)["index_key"]["key"]
    ]
    with pytest.raises(KeyRingError) as caught:
        parse_keyring(_variant(text, change), source="k.json")
    message = str(caught.value)
    assert words in message and message.startswith("k.json: ") and "\n" not in message
    assert _leaks(message, materials) == []


def test_not_json_names_the_position_not_the_text() -> None:
    with pytest.raises(KeyRingError) as caught:
        parse_keyring('{"keys": [SECRETSECRET', source="RMQKIT_KEYRING")
    assert "line 1" in str(caught.value) and "SECRET" not in str(caught.value)


# --- material never shown -----------------------------------------------------------------------
def test_material_never_shows_in_repr_str_summary_or_logs(tmp_path, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    path = tmp_path / "keys.json"
    generate(path)
    rotate(path)
    path.chmod(0o640)  # loaded with a warning
    ring = load_keyring(path)
    assert isinstance(ring, KeyRing)
    sealed = encrypt_fields({"t": "x"}, ["t"], ["t"], ring)
    decrypt_fields(sealed, None, ring)
    shown = " ".join(
        [
            repr(ring),
            str(ring),
            json.dumps(ring.summary()),
            repr(ring.keys),
            str(ring.current),
            repr(ring.index_key),
            f"{ring.current}",
            caplog.text,
        ]
    )
    assert ring.current_id in shown and ring.index_key.id in shown
    assert len(_leaks(path.read_text(), _materials(path))) == 3  # the check does see material
    assert _leaks(shown, _materials(path)) == []
    assert "readable by others" in caplog.text and "key ring loaded" in caplog.text


# --- the `rmqkit keys` commands -----------------------------------------------------------------
runner = CliRunner()


def test_cli_generate_rotate_activate_show(tmp_path) -> None:
    path = tmp_path / "ring.json"
    result = runner.invoke(app, ["generate", "--out", str(path)])
    assert result.exit_code == 0, result.output
    first = load_keyring_file(path)
    assert first.current_id in result.output and "mode 600" in result.output
    assert stat.S_IMODE(path.stat().st_mode) == 0o600

    again = runner.invoke(app, ["generate", "--out", str(path)])
    assert isinstance(again.exception, UsageError) and load_keyring_file(path).current_id == (
        first.current_id
    )

    result = runner.invoke(app, ["rotate", str(path), "--staged"])
    assert result.exit_code == 0 and "staged" in result.output
    staged = load_keyring_file(path)
    new_id = staged.key_ids[-1]
    assert staged.current_id == first.current_id
    assert runner.invoke(app, ["activate", str(path), new_id]).exit_code == 0
    result = runner.invoke(app, ["rotate", str(path)])
    assert result.exit_code == 0 and "now current" in result.output
    ring = load_keyring_file(path)
    assert len(ring.key_ids) == 3 and ring.current_id == ring.key_ids[-1]

    shown = runner.invoke(app, ["show", str(path)])
    assert shown.exit_code == 0
    lines = shown.output.splitlines()
    assert [ln.split()[1] for ln in lines if "encryption" in ln] == ring.key_ids
    assert ring.current_id in next(ln for ln in lines if "current" in ln and "decrypt" not in ln)
    assert ring.index_key.id in shown.output
    as_json = runner.invoke(app, ["show", str(path), "--json"])
    assert json.loads(as_json.output)["current"] == ring.current_id
    everything = result.output + shown.output + as_json.output
    assert _leaks(everything, _materials(path)) == []


def test_cli_show_from_the_environment(tmp_path) -> None:
    path = tmp_path / "ring.json"
    ring = generate(path)
    env = {"RMQKIT_KEYRING": path.read_text(), "RMQKIT_KEYRING_FILE": ""}
    result = runner.invoke(app, ["show"], env=env)
    assert result.exit_code == 0 and ring.current_id in result.output
    assert "RMQKIT_KEYRING" in result.output
    assert _leaks(result.output, _materials(path)) == []
    none = runner.invoke(app, ["show"], env={"RMQKIT_KEYRING": "", "RMQKIT_KEYRING_FILE": ""})
    assert isinstance(none.exception, ConfigError) and "no key ring" in str(none.exception)


@pytest.mark.parametrize("shape", ["json", "json-one-line", "base64-key", "urlsafe-key"])
def test_key_material_given_as_a_file_name_is_never_quoted(tmp_path, shape) -> None:
    ring = generate_keyring()
    text = ring.to_json()
    material = json.loads(text)["keys"][0]["key"]
    given = {
        "json": text,
        "json-one-line": " ".join(text.split()),
        "base64-key": material,
        "urlsafe-key": material.replace("+", "-").replace("/", "_"),
    }[shape]
    with pytest.raises(KeyRingError) as caught:
        load_keyring(given, None)
    said = str(caught.value)
    assert material[:8] not in said and "\n" not in said
    assert said.startswith("RMQKIT_KEYRING_FILE holds what looks like")
    assert "takes the path of a key-ring file" in said and "goes in RMQKIT_KEYRING" in said
    # a path is still shown, with what the setting should hold
    with pytest.raises(KeyRingError, match=r"/etc/nowhere/ring\.json: cannot read"):
        load_keyring("/etc/nowhere/ring.json", None)
    with pytest.raises(KeyRingError, match="a file path goes in RMQKIT_KEYRING_FILE"):
        load_keyring(None, "/etc/rmqkit/ring.json")


@pytest.mark.parametrize(
    "key",
    [
        # a key CI drew: "/" split it into runs of 11, 16 (no digit) and 15 characters
        "MycPL0cu7aC/sisPEjjIajRVlCDy/+R4GJgyWybJ230=",
        "abcDEFghiJKLmnoPQRstuVWXyzaBCDefgHIJklmNOPq=",  # no digit at all, padded
    ],
)
def test_a_key_that_base64_splits_with_slashes_is_never_quoted(key: str) -> None:
    with pytest.raises(KeyRingError) as caught:
        load_keyring(key, None)
    assert key[:8] not in str(caught.value) and key[-8:] not in str(caught.value)
