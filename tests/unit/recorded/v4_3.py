"""Headers RECORDED from RabbitMQ 4.3.6 (Erlang 29.1.2, node rmq43@vm).

Written by scripts/record-headers (tests/record_headers.py, which describes each
scenario) on 2026-12-01 12:50 UTC with aio-pika 10.2.1, aiormq 7.2.4, pamqp 4.0.1.
Do not edit by hand: re-run the script. Timestamps are the broker's, whole seconds.
"""

import datetime
from typing import Any

RABBITMQ_VERSION = "4.3.6"

FIRST_DELIVERY: Any = {"tenant": "t1"}

EMPTY_HEADERS_TABLE: Any = {}

REJECTED_REQUEUE_TWICE: Any = {"tenant": "t1", "x-acquired-count": 2, "x-delivery-count": 2}

NACKED_REQUEUE_TWICE: Any = {"tenant": "t1", "x-acquired-count": 2}

BROKER_LOOP_DELIVERY_2: Any = {
    "tenant": "t1",
    "x-acquired-count": 1,
    "x-death": [
        {
            "count": 1,
            "reason": "expired",
            "queue": "orders.work.wait.0",
            "time": datetime.datetime(2026, 12, 1, 12, 49, 55, tzinfo=datetime.UTC),
            "exchange": "",
            "routing-keys": ["orders.work.wait.0"],
        },
        {
            "count": 1,
            "reason": "rejected",
            "queue": "orders.work",
            "time": datetime.datetime(2026, 12, 1, 12, 49, 55, tzinfo=datetime.UTC),
            "exchange": "orders",
            "routing-keys": ["orders.created"],
        },
    ],
    "x-delivery-count": 1,
    "x-first-death-exchange": "orders",
    "x-first-death-queue": "orders.work",
    "x-first-death-reason": "rejected",
    "x-last-death-exchange": "",
    "x-last-death-queue": "orders.work.wait.0",
    "x-last-death-reason": "expired",
}

BROKER_LOOP_DELIVERY_3: Any = {
    "tenant": "t1",
    "x-acquired-count": 2,
    "x-death": [
        {
            "count": 2,
            "reason": "expired",
            "queue": "orders.work.wait.0",
            "time": datetime.datetime(2026, 12, 1, 12, 49, 57, tzinfo=datetime.UTC),
            "exchange": "",
            "routing-keys": ["orders.work.wait.0"],
        },
        {
            "count": 2,
            "reason": "rejected",
            "queue": "orders.work",
            "time": datetime.datetime(2026, 12, 1, 12, 49, 57, tzinfo=datetime.UTC),
            "exchange": "orders",
            "routing-keys": ["orders.created"],
        },
    ],
    "x-delivery-count": 2,
    "x-first-death-exchange": "orders",
    "x-first-death-queue": "orders.work",
    "x-first-death-reason": "rejected",
    "x-last-death-exchange": "",
    "x-last-death-queue": "orders.work.wait.0",
    "x-last-death-reason": "expired",
}

NAMED_EXCHANGE_LOOP: Any = {
    "tenant": "t1",
    "x-acquired-count": 1,
    "x-death": [
        {
            "count": 1,
            "reason": "expired",
            "queue": "orders.work.wait.0",
            "time": datetime.datetime(2026, 12, 1, 12, 49, 58, tzinfo=datetime.UTC),
            "exchange": "",
            "routing-keys": ["orders.work.wait.0"],
        },
        {
            "original-expiration": "60000",
            "count": 1,
            "reason": "rejected",
            "queue": "orders.work",
            "time": datetime.datetime(2026, 12, 1, 12, 49, 58, tzinfo=datetime.UTC),
            "exchange": "orders",
            "routing-keys": ["orders.created"],
        },
    ],
    "x-delivery-count": 1,
    "x-first-death-exchange": "orders",
    "x-first-death-queue": "orders.work",
    "x-first-death-reason": "rejected",
    "x-last-death-exchange": "",
    "x-last-death-queue": "orders.work.wait.0",
    "x-last-death-reason": "expired",
}

REPUBLISHED_STRIPPED: Any = {
    "rmqkit-attempt": 3,
    "rmqkit-original-exchange": "orders",
    "rmqkit-original-routing-key": "orders.created",
    "tenant": "t1",
    "x-death": [
        {
            "count": 1,
            "reason": "expired",
            "queue": "orders.work.wait.0",
            "time": datetime.datetime(2026, 12, 1, 12, 50, tzinfo=datetime.UTC),
            "exchange": "",
            "routing-keys": ["orders.work.wait.0"],
        }
    ],
    "x-first-death-exchange": "",
    "x-first-death-queue": "orders.work.wait.0",
    "x-first-death-reason": "expired",
    "x-last-death-exchange": "",
    "x-last-death-queue": "orders.work.wait.0",
    "x-last-death-reason": "expired",
}

REPUBLISHED_UNSTRIPPED: Any = {
    "rmqkit-attempt": 3,
    "rmqkit-original-exchange": "orders",
    "rmqkit-original-routing-key": "orders.created",
    "tenant": "t1",
    "x-death": [
        {
            "count": 1,
            "reason": "expired",
            "queue": "orders.work.wait.0",
            "time": datetime.datetime(2026, 12, 1, 12, 50, 2, tzinfo=datetime.UTC),
            "exchange": "",
            "routing-keys": ["orders.work.wait.0"],
        }
    ],
    "x-first-death-exchange": "",
    "x-first-death-queue": "orders.work.wait.0",
    "x-first-death-reason": "expired",
    "x-last-death-exchange": "",
    "x-last-death-queue": "orders.work.wait.0",
    "x-last-death-reason": "expired",
}

DELIVERY_LIMIT_PARKED: Any = {
    "tenant": "t1",
    "x-acquired-count": 3,
    "x-death": [
        {
            "count": 1,
            "reason": "delivery_limit",
            "queue": "orders.work",
            "time": datetime.datetime(2026, 12, 1, 12, 50, 2, tzinfo=datetime.UTC),
            "exchange": "orders",
            "routing-keys": ["orders.created"],
        }
    ],
    "x-delivery-count": 3,
    "x-first-death-exchange": "orders",
    "x-first-death-queue": "orders.work",
    "x-first-death-reason": "delivery_limit",
    "x-last-death-exchange": "orders",
    "x-last-death-queue": "orders.work",
    "x-last-death-reason": "delivery_limit",
}

NACKED_PAST_THE_LIMIT: Any = {"tenant": "t1", "x-acquired-count": 4}
