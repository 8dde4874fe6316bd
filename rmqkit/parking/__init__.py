"""Parking lane operations: inspect, replay, purge, export and import parked messages."""
