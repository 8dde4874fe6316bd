"""``python -m rmqkit`` is the ``rmqkit`` command."""

from rmqkit.cli.main import run

run()
