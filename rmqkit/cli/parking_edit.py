"""`rmqkit parking edit QUEUE MESSAGE_ID`: fix one parked message's body and retry it, audited.

Parse, one library call (``rmqkit.parking.edit.edit_parked``), render. The library does the
checks, the publish and the audit log (docs/parking.md, "Edit and retry").
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from rmqkit.cli.common import run_async, settings_from
from rmqkit.cli.completion import complete_queue
from rmqkit.cli.keyring_settings import keyring_of
from rmqkit.cli.parking_options import sensitive_for
from rmqkit.cli.render import stderr
from rmqkit.parking.audit import DEFAULT_AUDIT_LOG
from rmqkit.parking.edit import Editor, EditResult, body_from_file, edit_parked, run_editor
from rmqkit.topology import load_topology


def edit_cmd(
    ctx: typer.Context,
    queue: str = typer.Argument(..., help="Parking queue.", autocompletion=complete_queue),
    message_id: str = typer.Argument(..., help="message_id of the parked message to edit."),
    topology: Path = typer.Option(
        ...,
        "--topology",
        "-t",
        help="Topology file: its work queue whose parking queue this is must set "
        "allow_edit = true.",
    ),
    body_file: Path | None = typer.Option(
        None,
        "--body-file",
        help="Take the edited body from this file ('-': stdin) instead of opening $EDITOR.",
    ),
    handler: str | None = typer.Option(
        None,
        "--handler",
        help="Validate the edited body as this handler's body parameter (module:function), "
        "as the consumer would; an invalid edit is refused.",
    ),
    audit_log: Path = typer.Option(
        DEFAULT_AUDIT_LOG,
        "--audit-log",
        help="Append the audit entry (who, when, ids, body digests; never bodies) to this "
        "file, fsynced before the original is removed.",
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Edit and check, print what would be published, change nothing."
    ),
    as_json: bool = typer.Option(False, "--json", help="The result as one JSON object."),
) -> None:
    """Edit one parked message's body ($EDITOR, or --body-file) and send it where a replay
    would, under a new message_id with rmqkit-edited-from naming the original; the original
    is removed only after the broker confirmed the copy. Only the body can be edited: headers
    are rmqkit's and the broker's. Encrypted fields are shown and kept as stored (never
    decrypted); an edit that would publish one in plaintext is refused. Every edit is appended
    to the audit log first: if it cannot be written, nothing is published. An unchanged body
    or a failed editor publishes nothing (exit 64)."""
    settings = settings_from(ctx)
    spec = load_topology(topology)
    redact = sensitive_for(topology, queue)  # a dry run shows the body as `parking show` does
    edit: Editor = run_editor
    if body_file is not None:
        # Read before the broker is touched: a file that cannot be read changes nothing.
        edited = body_from_file(body_file)

        def edit(_stored: bytes) -> bytes:
            return edited

    ring = keyring_of(settings) if handler is not None else None
    result = run_async(
        edit_parked(
            settings,
            spec,
            queue,
            message_id,
            edit,
            handler=handler,
            audit_log=audit_log,
            keyring=ring,
            dry_run=dry_run,
        )
    )
    if as_json:
        print(json.dumps(result.as_dict(redact), ensure_ascii=False, default=str))
        return
    _render(result, redact)


def _render(result: EditResult, redact: frozenset[str]) -> None:
    target = f"exchange {result.exchange or '(default)'} key {result.routing_key}"
    checked = f", validated as {result.validated_as}" if result.validated_as else ""
    if result.dry_run:
        print(f"would publish the edited {result.message_id} → {target}{checked}")
        shown_result = result.as_dict(redact)
        print(json.dumps(shown_result["headers"], indent=2, ensure_ascii=False, default=str))
        shown = shown_result["body"]
        print(shown if isinstance(shown, str) else json.dumps(shown, indent=2, ensure_ascii=False))
        stderr.print("dry run: nothing published, removed or logged", highlight=False)
        return
    print(
        f"edited {result.message_id} → {result.new_message_id}: published to {target} "
        f"(confirmed){checked}; removed from {result.queue}"
    )
    stderr.print(f"audit entry appended to {result.audit_log}", highlight=False)
