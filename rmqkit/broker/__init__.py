"""The only code that talks to RabbitMQ, and the only code that imports its client libraries.

AMQP goes through a ``session.Session`` (connection, channels, probes, the confirmed publisher;
``channel.Delivery`` is what consumers read); the management HTTP API through
``management.ManagementClient``; a queue's settings in effect come from ``policies``; header
values and properties keep their exact AMQP types through ``codec``. aio-pika, aiormq and pamqp are
imported here and nowhere else (``tests/unit/test_layers.py``), and their private names only in
``internals`` (``tests/unit/test_dependency_contract.py``).
"""
