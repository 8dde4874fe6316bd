"""Raises while being imported (multi-line message on purpose)."""

raise RuntimeError("settings missing:\n  DATABASE_URL is not set")
