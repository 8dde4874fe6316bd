"""Ports for the consumers' and relays' metrics servers that tests start.

A port the kernel hands out for ``bind(("127.0.0.1", 0))`` comes from the ephemeral range, the
same range it draws from for every outgoing connection (AMQP, PostgreSQL, HTTP). Between the
probe closing and the consumer binding it, the port could become the source port of one of
those connections, and the consumer's worker would then exit on "metrics port in use" (a CI run
lost a consumer that way). Ports below the ephemeral range are never handed out on their own.
"""

from __future__ import annotations

import random
import socket

_LOW, _HIGH = 20_000, 32_000  # below Linux's default ip_local_port_range (32768-60999)
_given: set[int] = set()


def bindable(port: int) -> bool:
    """Whether a listening socket could bind 127.0.0.1:``port`` now."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(span: int = 1) -> int:
    """A port P where P..P+span-1 are free now and were not given to this process before.

    ``span`` covers a consumer's workers (worker i serves on P+i).
    """
    for _ in range(1000):
        port = random.randrange(_LOW, _HIGH - span)
        ports = range(port, port + span)
        if any(p in _given for p in ports) or not all(bindable(p) for p in ports):
            continue
        _given.update(ports)
        return port
    raise RuntimeError("no free port below the ephemeral range")


def closed_port() -> int:
    """A port nothing listens on (for "connection refused" tests)."""
    return free_port()
