"""Publishing for applications: ``rmqkit.Publisher`` (async), ``rmqkit.SyncPublisher``
(its own loop in a thread, for WSGI), ``PublishMessage`` (one of ``publish_many``) and
``PublishResult`` (how the broker settled one message). See docs/api.md."""

from rmqkit.publishing.prepare import PublishMessage
from rmqkit.publishing.publisher import Publisher
from rmqkit.publishing.results import PublishResult
from rmqkit.publishing.sync import SyncPublisher

__all__ = ["PublishMessage", "PublishResult", "Publisher", "SyncPublisher"]
