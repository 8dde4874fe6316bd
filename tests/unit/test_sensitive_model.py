"""``rmqkit.Sensitive`` on pydantic model fields (issue 16): the walker (rmqkit.crypto.model),
the publishing edge (``Encryptor(model=)``, ``outbox.add`` with a model body) and the consumer's
view (``LoadedHandler.sensitive``, ``build_config``'s encrypted fields and start-up warning)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import pytest
from pydantic import BaseModel, ConfigDict, Field

import rmqkit
import rmqkit.outbox
from rmqkit.consumer.config import ConsumerFlags, build_config, policy_from_topology
from rmqkit.consumer.loading import load_handler
from rmqkit.crypto import decrypt_fields, generate_keyring, is_envelope, sensitive_fields
from rmqkit.outbox import Encryptor
from rmqkit.topology.model import parse_topology
from tests.sensitive_handlers import TOPOLOGY

S = rmqkit.Sensitive


class Address(BaseModel):
    street: Annotated[str, S()]
    city: str


class Customer(BaseModel):
    name: Annotated[str, S()]
    email: Annotated[str, S(blind_index=True)] | None = None
    address: Address | None = None


class Order(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    id: str
    customer: Customer
    billing: Optional[Customer] = None  # noqa: UP045 - the Optional spelling is walked too
    tax_id: Annotated[str, S(blind_index=True)] = Field(alias="taxId")
    note: Annotated[str, S()] = Field("", serialization_alias="n")
    items: list[str] = []
    extra: dict[str, int] = {}


class Listed(BaseModel):
    customers: list[Customer]


class Mapped(BaseModel):
    by_id: dict[str, Customer]


class Node(BaseModel):
    name: Annotated[str, S()]
    parent: Node | None = None


class PlainNode(BaseModel):
    name: str
    parent: PlainNode | None = None


class Plain(BaseModel):
    id: str
    node: PlainNode | None = None
    tags: list[str] = []


class Early(BaseModel):
    """Names a model defined after it: pydantic resolves the reference on a rebuild."""

    later: Later | None = None


class Later(BaseModel):
    secret: Annotated[str, S()]


class Dotted(BaseModel):
    secret: Annotated[str, S()] = Field(alias="a.b")


class WholeList(BaseModel):
    cards: Annotated[list[Customer], S()]  # the whole list is one encrypted value


ORDER_PATHS = (
    "customer.name",
    "customer.email",
    "customer.address.street",
    "billing.name",
    "billing.email",
    "billing.address.street",
    "taxId",
    "n",
)


def test_nested_optional_and_aliased_fields_by_json_key() -> None:
    paths, indexed = sensitive_fields(Order)
    assert paths == ORDER_PATHS
    assert indexed == ("customer.email", "billing.email", "taxId")


def test_by_field_name() -> None:
    paths, indexed = sensitive_fields(Order, by_alias=False)
    assert paths[-2:] == ("tax_id", "note")
    assert indexed[-1] == "tax_id"


def test_a_type_built_from_a_model_and_the_cache() -> None:
    assert sensitive_fields(Order | None) == sensitive_fields(Order)
    assert sensitive_fields(Order) is sensitive_fields(Order)  # cached per class


@pytest.mark.parametrize("model", [Plain, PlainNode, dict, list[str], str])
def test_no_marks_no_fields(model: Any) -> None:
    assert sensitive_fields(model) == ((), ())


def test_a_model_naming_one_defined_after_it() -> None:
    assert sensitive_fields(Early) == (("later.secret",), ())


def test_a_marked_container_is_one_value() -> None:
    assert sensitive_fields(WholeList) == (("cards",), ())


def test_marks_in_list_items_are_array_paths() -> None:
    item = ("name", "email", "address.street")
    assert sensitive_fields(Listed) == (
        tuple(f"customers[].{p}" for p in item),
        ("customers[].email",),
    )
    assert sensitive_fields(list[Customer]) == (tuple(f"[].{p}" for p in item), ("[].email",))


@pytest.mark.parametrize(
    ("model", "says"),
    [
        (Mapped, "field by_id is a dict[str, Customer]"),
        (dict[str, Customer], "the model is a dict[str, Customer]"),
        (Node, "Node is recursive"),
        (Dotted, "a.b"),
    ],
)
def test_marks_no_path_can_name_are_refused(model: Any, says: str) -> None:
    with pytest.raises(rmqkit.ConfigError) as refused:
        sensitive_fields(model)
    assert says in str(refused.value)
    assert refused.value.exit_code == 78


def test_import_rmqkit_does_not_import_pydantic() -> None:
    code = "import sys, rmqkit; rmqkit.Sensitive; print('pydantic' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


# --- the publishing edge ---------------------------------------------------------------------
def order() -> Order:
    return Order(
        id="o-1",
        customer=Customer(name="Ada", email="ada@example.org", address=None),
        tax_id="123",
        note="fragile",
        items=["x"],
    )


def test_encryptor_from_env_with_a_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RMQKIT_KEYRING", raising=False)
    monkeypatch.delenv("RMQKIT_KEYRING_FILE", raising=False)
    enc = Encryptor.from_env(fields=["other"], model=Order)
    assert enc.fields[0] == "other"
    # both spellings of an aliased field: a body may be dumped by alias or by name
    assert {"taxId", "tax_id", "n", "note", "customer.name"} <= set(enc.fields)
    assert {"taxId", "tax_id"} <= set(enc.blind_index)


@pytest.mark.parametrize("by_alias", [False, True])
def test_encryptor_encrypt_with_model_either_dump(by_alias: bool) -> None:
    ring = generate_keyring()
    raw = order().model_dump_json(by_alias=by_alias).encode()
    sealed = json.loads(Encryptor(keyring=ring).encrypt("x", "y", raw, model=Order))
    assert is_envelope(sealed["customer"]["name"]) and is_envelope(sealed["customer"]["email"])
    assert is_envelope(sealed["taxId" if by_alias else "tax_id"])
    assert sealed["id"] == "o-1" and sealed["items"] == ["x"]
    assert decrypt_fields(sealed, None, ring) == json.loads(raw)


def _outbox(tmp_path: Path) -> sqlite3.Connection:
    rmqkit.outbox.init(f"sqlite:///{tmp_path}/app.db")
    return sqlite3.connect(tmp_path / "app.db")


def test_add_a_marked_model_without_encryptor_writes_nothing(tmp_path: Path) -> None:
    conn = _outbox(tmp_path)
    with pytest.raises(rmqkit.ConfigError) as refused:
        rmqkit.outbox.add(conn, exchange="orders", routing_key="o", body=order())
    assert "Order" in str(refused.value) and "customer.name" in str(refused.value)
    assert conn.execute("SELECT count(*) FROM rmqkit_outbox").fetchone() == (0,)
    # an unmarked model, and a plain dict, are written as before
    rmqkit.outbox.add(conn, exchange="orders", routing_key="o", body=Plain(id="1"))
    rmqkit.outbox.add(conn, exchange="orders", routing_key="o", body={"tax_id": "1"})
    assert conn.execute("SELECT count(*) FROM rmqkit_outbox").fetchone() == (2,)


def test_add_a_marked_model_with_encryptor_stores_ciphertext(tmp_path: Path) -> None:
    ring = generate_keyring()
    conn = _outbox(tmp_path)
    rmqkit.outbox.add(
        conn, exchange="o", routing_key="o", body=order(), encryptor=Encryptor(keyring=ring)
    )
    (stored,) = conn.execute("SELECT body FROM rmqkit_outbox").fetchone()
    for value in (b"Ada", b"ada@example.org", b"fragile", b'"123"'):
        assert value not in bytes(stored)
    assert decrypt_fields(json.loads(stored), None, ring) == order().model_dump(by_alias=True)


# --- the consumer ----------------------------------------------------------------------------


def test_loaded_handler_lists_its_models_marks() -> None:
    loaded = load_handler("tests.sensitive_handlers:seen_person")
    assert loaded.sensitive == (("customer.name", "tax_id"), ("tax_id",))


def test_a_handler_on_a_list_of_marked_models_lists_array_paths() -> None:
    loaded = load_handler("tests.sensitive_handlers:seen_people")
    assert loaded.sensitive == (("[].customer.name", "[].tax_id"), ("[].tax_id",))


def test_build_config_adds_marked_fields_and_warns_about_those_the_topology_lacks() -> None:
    topology = parse_topology(TOPOLOGY, "people.toml")
    policy = policy_from_topology(topology, "people.work", None)
    spec = "tests.sensitive_handlers:seen_person"
    loaded = load_handler(spec)
    config = build_config(spec, "people.work", policy, ConsumerFlags(), topology, loaded=loaded)
    assert config.encrypted_fields == ("customer.name", "tax_id")
    warned = [w for w in config.warnings if "rmqkit.Sensitive" in w]
    assert len(warned) == 1
    assert "Person marks tax_id" in warned[0] and "people.toml" in warned[0]
    # without a topology there is nothing to compare with: the fields, no warning
    bare = build_config(spec, "people.work", policy, ConsumerFlags(), loaded=loaded)
    assert bare.encrypted_fields == ("customer.name", "tax_id")
    assert not [w for w in bare.warnings if "rmqkit.Sensitive" in w]
    # no handler given (the unit tests' "m:f"): as before
    other = build_config("m:f", "people.work", policy, ConsumerFlags(), topology)
    assert other.encrypted_fields == ("customer.name",)
