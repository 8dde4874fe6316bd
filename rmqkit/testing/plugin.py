"""The pytest plugin of rmqkit (entry point ``pytest11``): the ``rmqkit_broker`` fixture.

Loaded by pytest whenever rmqkit is installed, so this module imports nothing of rmqkit at
load time: the broker code is imported when a test asks for the fixture.

``rmqkit_broker`` gives a test a vhost of its own on a real broker (``RMQKIT_URL``, management
API ``RMQKIT_MANAGEMENT_URL``; defaults: guest on localhost), deleted after the test however it
ended. Override the ``rmqkit_settings`` fixture to point it elsewhere. See docs/testing.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from rmqkit.settings import Settings
    from rmqkit.testing.broker import RmqkitBroker


@pytest.fixture
def rmqkit_settings() -> Settings:
    """The broker ``rmqkit_broker`` makes its vhosts on (default: the ``RMQKIT_*`` environment;
    the vhost of the URL is not used)."""
    from rmqkit.settings import load_settings

    return load_settings()


@pytest.fixture
def rmqkit_broker(rmqkit_settings: Settings) -> Iterator[RmqkitBroker]:
    """A throwaway vhost on a real broker: ``declare(path)``, ``publish(...)``,
    ``consume_until_idle(handler, queue)``, ``parked(queue)``, ``depths()``."""
    from rmqkit.testing.broker import RmqkitBroker

    broker = RmqkitBroker(rmqkit_settings)
    try:
        broker.open()
        yield broker
    finally:
        broker.close()
