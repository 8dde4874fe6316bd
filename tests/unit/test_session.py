"""The broker layer's delivery type fits the client's object, without a broker.

``rmqkit.broker.channel.Delivery`` is a Protocol the client's delivered message satisfies as it
is (no wrapper per message); ``Channel.consume`` casts the callback on that promise. These
tests keep the promise checked against the installed aiormq/pamqp: a client that renames a field
fails here, not in a consumer at run time.
"""

from __future__ import annotations

import dataclasses
import inspect

import aiormq.abc
from pamqp import commands as spec
from pamqp.header import ContentHeader

from rmqkit.broker import channel as channel_mod
from rmqkit.broker.codec import Properties, TypedProperties
from rmqkit.broker.session import CONNECTION_ERRORS


def _protocol_members(cls: type) -> set[str]:
    return {name for name, _ in inspect.getmembers(cls) if not name.startswith("_")}


def test_the_clients_delivered_message_has_every_field_of_delivery() -> None:
    fields = {f.name for f in dataclasses.fields(aiormq.abc.DeliveredMessage)}
    assert _protocol_members(channel_mod.Delivery) <= fields


def test_a_basic_deliver_and_a_content_header_have_what_delivery_reads() -> None:
    deliver = spec.Basic.Deliver(
        consumer_tag="c", delivery_tag=7, redelivered=True, exchange="x", routing_key="k"
    )
    for name in _protocol_members(channel_mod.DeliverFrame):
        assert hasattr(deliver, name), name
    header = ContentHeader(properties=TypedProperties(message_id="m"), body_size=0)
    for name in _protocol_members(channel_mod.ContentHeader):
        assert hasattr(header, name), name
    assert isinstance(header.properties, Properties)
    delivered = aiormq.abc.DeliveredMessage(
        delivery=deliver, header=header, body=b"b", channel=object()
    )
    assert delivered.delivery.delivery_tag == 7 and delivered.header.properties.message_id == "m"


def test_connection_errors_cover_what_a_lost_channel_raises() -> None:
    assert issubclass(aiormq.exceptions.ChannelInvalidStateError, CONNECTION_ERRORS)
    assert issubclass(aiormq.exceptions.AMQPConnectionError, CONNECTION_ERRORS)
    assert issubclass(ConnectionResetError, CONNECTION_ERRORS)
