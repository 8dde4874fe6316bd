"""`rmqkit publish`'s library: message ids (``rmqkit.publishing.ids``), its inputs
(``rmqkit.publishing.inputs``), its engine (``rmqkit.publishing.engine``, reporting with
``rmqkit.publishing.report``) and the one call the
command makes (``rmqkit.publishing.stream.publish_input``: the topology edge, then the engine),
under the names they always had here. Applications publish with ``rmqkit.Publisher``
(docs/api.md)."""

from rmqkit.publishing.edge import SensitiveIdError
from rmqkit.publishing.engine import (
    DEFAULT_WINDOW,
    Notice,
    Progress,
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
from rmqkit.publishing.report import PublishReport
from rmqkit.publishing.stream import PublishEdge, publish_input

__all__ = [
    "DEFAULT_WINDOW",
    "ID_NAMESPACE",
    "IdSource",
    "Notice",
    "OutgoingMessage",
    "Progress",
    "PublishEdge",
    "PublishReport",
    "SensitiveIdError",
    "derived_message_id",
    "messages_from_bodies",
    "messages_from_lines",
    "messages_from_ndjson",
    "new_message_id",
    "publish_input",
    "publish_messages",
    "rerun_advice",
]
