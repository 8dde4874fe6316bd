"""Handlers that take a rmqkit.Transaction: loading them, and run_handler passing the transaction
(no broker, no database: the transaction is a stand-in object here)."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import pytest

from rmqkit.consumer.decision import Failed, Success
from rmqkit.consumer.handler import load_handler, run_handler
from rmqkit.consumer.message import Message
from rmqkit.errors import ConfigError

MODULE = """
from __future__ import annotations
import rmqkit
from rmqkit import Transaction

seen = []

async def with_tx(message: rmqkit.Message, tx: rmqkit.Transaction) -> None:
    seen.append((message.message_id, tx))

def sync_with_tx(body: bytes, tx: Transaction) -> None:
    seen.append((body, tx))
    if body == b"fail":
        raise ConnectionError("write failed")

async def two_plain(message, other) -> None:
    pass

async def one(message: rmqkit.Message) -> None:
    pass
"""


@pytest.fixture
def handlers(tmp_path: Path) -> str:
    name = f"txhandlers_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(MODULE))
    return name


def test_a_second_parameter_annotated_transaction_is_recognised(
    handlers: str, tmp_path: Path
) -> None:
    loaded = load_handler(f"{handlers}:with_tx", cwd=tmp_path)
    assert loaded.takes_transaction and loaded.is_async
    assert "tx: Transaction" in loaded.describe()
    sync = load_handler(f"{handlers}:sync_with_tx", cwd=tmp_path)
    assert sync.takes_transaction and not sync.is_async
    assert not load_handler(f"{handlers}:one", cwd=tmp_path).takes_transaction
    with pytest.raises(ConfigError, match="takes 2 required arguments"):
        load_handler(f"{handlers}:two_plain", cwd=tmp_path)


def test_run_handler_passes_the_transaction(handlers: str, tmp_path: Path) -> None:
    import importlib

    load_handler(f"{handlers}:one", cwd=tmp_path)  # puts tmp_path on sys.path
    module = importlib.import_module(handlers)
    tx = object()

    async def main() -> list[object]:
        outcomes: list[object] = []
        for spec, body in (("with_tx", b"{}"), ("sync_with_tx", b"ok"), ("sync_with_tx", b"fail")):
            loaded = load_handler(f"{handlers}:{spec}", cwd=tmp_path)
            outcomes.append(
                await run_handler(
                    loaded,
                    Message(body, message_id="m-1"),
                    timeout_s=5,
                    permanent_types=frozenset(),
                    transaction=tx,
                )
            )
        return outcomes

    outcomes = asyncio.run(main())
    assert isinstance(outcomes[0], Success) and isinstance(outcomes[1], Success)
    assert isinstance(outcomes[2], Failed) and outcomes[2].exc_type == "ConnectionError"
    assert module.seen == [("m-1", tx), (b"ok", tx), (b"fail", tx)]
