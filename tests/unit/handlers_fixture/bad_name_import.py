"""Imports a name that its module does not have."""

from os import rmqkit_no_such_name  # type: ignore[attr-defined]  # noqa: F401


async def handle(message: object) -> None:
    pass
