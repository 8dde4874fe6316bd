"""`rmqkit publish`'s library: message ids (``rmqkit.publishing.ids``), its inputs
(``rmqkit.publishing.inputs``) and its engine (``rmqkit.publishing.engine``), under the names
they always had here. Applications publish with ``rmqkit.Publisher`` (docs/api.md)."""

from rmqkit.publishing.engine import (
    DEFAULT_WINDOW,
    Notice,
    Progress,
    PublishReport,
    publish_messages,
    rerun_advice,
)
from rmqkit.publishing.ids import ID_NAMESPACE, IdSource, derived_message_id, new_message_id
from rmqkit.publishing.inputs import (
    OutgoingMessage,
    messages_from_bodies,
    messages_from_lines,
    messages_from_ndjson,
)

__all__ = [
    "DEFAULT_WINDOW",
    "ID_NAMESPACE",
    "IdSource",
    "Notice",
    "OutgoingMessage",
    "Progress",
    "PublishReport",
    "derived_message_id",
    "messages_from_bodies",
    "messages_from_lines",
    "messages_from_ndjson",
    "new_message_id",
    "publish_messages",
    "rerun_advice",
]
