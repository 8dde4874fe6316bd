"""Parking lane operations: inspect, replay, purge, export and import parked messages.

Every command is one safe browse of the parking queue (``browse``) over a typed
``rmqkit.broker.session.Session`` (``ops.parking_session``); nothing here speaks AMQP directly.
"""
