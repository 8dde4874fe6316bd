"""`rmqkit parking list | show | stats | groups | replay | purge | export | import | archive |
restore | edit`.

The group only: the reading commands live in ``parking_inspect`` (``groups`` in
``parking_groups``), the ones that move messages in ``parking_move`` (``archive`` and
``restore`` in ``parking_archive``, ``edit`` in ``parking_edit``), the options they share
(one definition) in ``parking_options``.
"""

from __future__ import annotations

import typer

from rmqkit.cli import (
    parking_archive,
    parking_edit,
    parking_groups,
    parking_inspect,
    parking_move,
)

app = typer.Typer(
    help="Inspect, replay, purge, export and import parked messages (never losing any).",
    no_args_is_help=True,
)

app.command("list")(parking_inspect.list_cmd)
app.command("show")(parking_inspect.show_cmd)
app.command("stats")(parking_inspect.stats_cmd)
app.command("groups")(parking_groups.groups_cmd)
app.command("replay")(parking_move.replay_cmd)
app.command("purge")(parking_move.purge_cmd)
app.command("export")(parking_move.export_cmd)
app.command("import")(parking_move.import_cmd)
app.command("archive")(parking_archive.archive_cmd)
app.command("restore")(parking_archive.restore_cmd)
app.command("edit")(parking_edit.edit_cmd)
