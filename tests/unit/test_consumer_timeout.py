"""The consumer timeout a consumer asks for on 4.3 (x-consumer-timeout on its basic.consume),
derived from the handler timeout; none before 4.3 or without a handler timeout."""

from __future__ import annotations

from dataclasses import replace

from rmqkit.consumer.config import ConsumerConfig, QueuePolicy, consumer_timeout_ms
from rmqkit.consumer.runner import consume_arguments


def _config(handler_timeout_s: float | None) -> ConsumerConfig:
    policy = QueuePolicy(
        queue="q",
        parking_queue="q.parking",
        retry_delays_ms=(1000,),
        max_attempts=5,
        wait_queues=(("q.wait.1",),),
    )
    return ConsumerConfig(
        handler="m:h", queue="q", policy=policy, handler_timeout_s=handler_timeout_s
    )


def test_the_timeout_is_the_handlers_plus_a_margin() -> None:
    assert consumer_timeout_ms(None) is None
    assert consumer_timeout_ms(1.0) == 61_000  # the handler's timeout + at least 60 s
    assert consumer_timeout_ms(600.0) == 1_200_000  # ... or + the handler's timeout again


def test_it_is_asked_for_on_4_3_only_and_only_with_a_handler_timeout() -> None:
    config = _config(30.0)
    assert consume_arguments((4, 3, 0), config) == {"x-consumer-timeout": 90_000}
    assert consume_arguments((4, 3, 6), config) == {"x-consumer-timeout": 90_000}
    assert consume_arguments((4, 2, 9), config) is None
    assert consume_arguments((3, 10, 8), config) is None
    assert consume_arguments((4, 3, 6), replace(config, handler_timeout_s=None)) is None
