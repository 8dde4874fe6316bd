"""Old home of ``rmqkit.broker.codec.hook``: import from ``rmqkit.broker.codec`` instead.

Kept only while tests and modules owned by other changes still import this path (issue 11);
it re-exports public names only. Delete it once nothing imports ``rmqkit.broker.pamqp_hook``.
"""

from __future__ import annotations

from rmqkit.broker.codec import (
    SUPPORTED_PAMQP_MAJORS,
    connect_typed,
    install,
    is_installed,
    pamqp_problems,
    typed_decoding,
    uninstall,
)

__all__ = [
    "SUPPORTED_PAMQP_MAJORS",
    "connect_typed",
    "install",
    "is_installed",
    "pamqp_problems",
    "typed_decoding",
    "uninstall",
]
