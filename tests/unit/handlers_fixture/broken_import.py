"""Imports a package that does not exist."""

import rmqkit_nonexistent_dependency  # type: ignore[import-not-found]  # noqa: F401


async def handle(message: object) -> None:
    pass
