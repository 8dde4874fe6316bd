"""Headers RECORDED from RabbitMQ 3.10.8 (Erlang 25.2.3, node rabbit@localhost).

Written by scripts/record-headers (tests/record_headers.py, which describes each
scenario) on 2026-12-01 12:49 UTC with aio-pika 10.2.1, aiormq 7.2.4, pamqp 4.0.1.
Do not edit by hand: re-run the script. Timestamps are the broker's, whole seconds.
"""

import datetime
from typing import Any

RABBITMQ_VERSION = "3.10.8"

FIRST_DELIVERY: Any = {"tenant": "t1", "x-delivery-count": 0}

EMPTY_HEADERS_TABLE: Any = {"x-delivery-count": 0}

REJECTED_REQUEUE_TWICE: Any = {"tenant": "t1", "x-delivery-count": 2}

NACKED_REQUEUE_TWICE: Any = {"tenant": "t1", "x-delivery-count": 2}

BROKER_LOOP_DELIVERY_2: Any = {
    "tenant": "t1",
    "x-death": [
        {
            "count": 1,
            "exchange": "",
            "queue": "orders.work.wait.0",
            "reason": "expired",
            "routing-keys": ["orders.work.wait.0"],
            "time": datetime.datetime(2026, 12, 1, 12, 48, 54, tzinfo=datetime.UTC),
        },
        {
            "count": 1,
            "reason": "rejected",
            "queue": "orders.work",
            "time": datetime.datetime(2026, 12, 1, 12, 48, 54, tzinfo=datetime.UTC),
            "exchange": "orders",
            "routing-keys": ["orders.created"],
        },
    ],
    "x-delivery-count": 0,
    "x-first-death-exchange": "orders",
    "x-first-death-queue": "orders.work",
    "x-first-death-reason": "rejected",
}

BROKER_LOOP_DELIVERY_3: Any = {
    "tenant": "t1",
    "x-death": [
        {
            "count": 2,
            "exchange": "",
            "queue": "orders.work.wait.0",
            "reason": "expired",
            "routing-keys": ["orders.work.wait.0"],
            "time": datetime.datetime(2026, 12, 1, 12, 48, 55, tzinfo=datetime.UTC),
        },
        {
            "count": 2,
            "exchange": "orders",
            "queue": "orders.work",
            "reason": "rejected",
            "routing-keys": ["orders.created"],
            "time": datetime.datetime(2026, 12, 1, 12, 48, 55, tzinfo=datetime.UTC),
        },
    ],
    "x-delivery-count": 0,
    "x-first-death-exchange": "orders",
    "x-first-death-queue": "orders.work",
    "x-first-death-reason": "rejected",
}

NAMED_EXCHANGE_LOOP: Any = {
    "tenant": "t1",
    "x-death": [
        {
            "count": 1,
            "exchange": "",
            "queue": "orders.work.wait.0",
            "reason": "expired",
            "routing-keys": ["orders.work.wait.0"],
            "time": datetime.datetime(2026, 12, 1, 12, 48, 57, tzinfo=datetime.UTC),
        },
        {
            "count": 1,
            "reason": "rejected",
            "queue": "orders.work",
            "time": datetime.datetime(2026, 12, 1, 12, 48, 57, tzinfo=datetime.UTC),
            "exchange": "orders",
            "routing-keys": ["orders.created"],
            "original-expiration": "60000",
        },
    ],
    "x-delivery-count": 0,
    "x-first-death-exchange": "orders",
    "x-first-death-queue": "orders.work",
    "x-first-death-reason": "rejected",
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
            "time": datetime.datetime(2026, 12, 1, 12, 48, 59, tzinfo=datetime.UTC),
            "exchange": "",
            "routing-keys": ["orders.work.wait.0"],
        }
    ],
    "x-delivery-count": 0,
    "x-first-death-exchange": "",
    "x-first-death-queue": "orders.work.wait.0",
    "x-first-death-reason": "expired",
}

REPUBLISHED_UNSTRIPPED: Any = {
    "rmqkit-attempt": 3,
    "rmqkit-original-exchange": "orders",
    "rmqkit-original-routing-key": "orders.created",
    "tenant": "t1",
    "x-death": [
        {
            "count": 3,
            "exchange": "",
            "queue": "orders.work.wait.0",
            "reason": "expired",
            "routing-keys": ["orders.work.wait.0"],
            "time": datetime.datetime(2026, 12, 1, 12, 49, tzinfo=datetime.UTC),
        }
    ],
    "x-delivery-count": 0,
    "x-first-death-exchange": "",
    "x-first-death-queue": "orders.work.wait.0",
    "x-first-death-reason": "expired",
}

DELIVERY_LIMIT_PARKED: Any = {
    "tenant": "t1",
    "x-death": [
        {
            "count": 1,
            "reason": "delivery_limit",
            "queue": "orders.work",
            "time": datetime.datetime(2026, 12, 1, 12, 49, 1, tzinfo=datetime.UTC),
            "exchange": "orders",
            "routing-keys": ["orders.created"],
        }
    ],
    "x-delivery-count": 0,
    "x-first-death-exchange": "orders",
    "x-first-death-queue": "orders.work",
    "x-first-death-reason": "delivery_limit",
}

NACKED_PAST_THE_LIMIT: Any = {
    "parked": {
        "tenant": "t1",
        "x-death": [
            {
                "count": 1,
                "reason": "delivery_limit",
                "queue": "orders.work",
                "time": datetime.datetime(2026, 12, 1, 12, 49, 2, tzinfo=datetime.UTC),
                "exchange": "orders",
                "routing-keys": ["orders.created"],
            }
        ],
        "x-delivery-count": 0,
        "x-first-death-exchange": "orders",
        "x-first-death-queue": "orders.work",
        "x-first-death-reason": "delivery_limit",
    }
}
