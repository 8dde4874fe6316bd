"""String annotations (``from __future__ import annotations``), including a TYPE_CHECKING import."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel

if TYPE_CHECKING:
    from rmqkit import Message
    from rmqkit.topology.model import Topology


class Payment(BaseModel):
    amount: int


async def handle_payment(payment: Payment) -> None:
    pass


async def handle_message(message: Message) -> Topology | None:
    return None


async def handle_unresolvable(payment: UndefinedModel) -> None:  # type: ignore[name-defined]  # noqa: F821
    pass
