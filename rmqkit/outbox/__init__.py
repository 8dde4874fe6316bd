"""The transactional outbox: events written in the application's transaction, relayed to RabbitMQ.

Writing (in the caller's open transaction, never committing)::

    import rmqkit.outbox

    with conn.transaction():                       # psycopg; or a sqlite3 connection
        conn.execute("INSERT INTO orders ...", ...)
        rmqkit.outbox.add(conn, exchange="orders", routing_key="order.created",
                          body={"id": 42}, aggregate="order-42")

    await rmqkit.outbox.add_async(aconn, ...)      # psycopg AsyncConnection
    rmqkit.outbox.add_sqlalchemy(session, ...)     # a SQLAlchemy Session or Connection

Delayed and encrypted rows (docs/outbox.md)::

    enc = rmqkit.outbox.Encryptor.from_env("topology.toml")   # once: key ring + sensitive fields
    rmqkit.outbox.add(conn, ..., delay="90s", encryptor=enc)  # the row stores ciphertext

Relaying: ``rmqkit outbox init|relay|status --dsn DSN`` (``init``, ``run_relay``,
``outbox_status`` here). docs/outbox.md has the schema, the guarantees and the ordering rules.
"""

from __future__ import annotations

from rmqkit.outbox.relay import Relay, RelayOptions, RelayReport, run_relay
from rmqkit.outbox.schema import TABLE, ddl, init
from rmqkit.outbox.status import OutboxStatus, outbox_status
from rmqkit.outbox.write import add, add_async, add_sqlalchemy, encode_body
from rmqkit.publishing.routing import Edge, Encryptor

__all__ = [
    "TABLE",
    "Edge",
    "Encryptor",
    "OutboxStatus",
    "Relay",
    "RelayOptions",
    "RelayReport",
    "add",
    "add_async",
    "add_sqlalchemy",
    "ddl",
    "encode_body",
    "init",
    "outbox_status",
    "run_relay",
]
