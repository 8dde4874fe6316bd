"""rmqkit.names: every derived queue name built and parsed back by the one module that owns them."""

from __future__ import annotations

from rmqkit import names


def test_built_names_parse_back() -> None:
    wait = names.wait_queue("orders.work", 5000)
    slot = names.slot_queue(wait, 2500)
    assert (wait, slot) == ("orders.work.wait.5s", "orders.work.wait.5s.slot-2500ms")
    assert names.wait_delay_ms(slot, "orders.work") == 5000
    assert names.tier_of(slot) == wait and names.tier_of(wait) == wait
    assert names.slot_text(slot) == "2500ms" and names.slot_text(wait) is None
    assert names.parking_queue("orders.work") == "orders.work.parking"
    assert names.is_parking_name("orders.work.parking") and not names.is_parking_name("orders")
    lane, part = names.lane_queue("orders.work", "big"), names.partition_queue("orders.work", 3)
    assert (lane, part) == ("orders.work.lane.big", "orders.work.p3")
    assert names.flow_parent(lane) == names.flow_parent(part) == "orders.work"
    assert names.partition_index(part, "orders.work") == 3 and names.is_lane_of(lane, "orders.work")
    assert names.partition_exchange("orders.work") == "orders.work.partition"


def test_names_that_only_look_derived_are_not() -> None:
    assert names.wait_delay_ms("orders.work.wait.list", "orders.work") is None
    assert names.wait_delay_ms("orders.wait.5s", "orders.work") is None
    assert not names.is_derived_suffix(".wait.list")
    assert names.is_derived_suffix(".lane.big.wait.5s.slot-2500ms")
    assert names.flow_parent("orders.work") is None
    assert names.partition_index("orders.work.p3x", "orders.work") is None
    assert not names.is_lane_of("orders.work.lane.a.b", "orders.work")
    assert not names.is_flow_member("other.p1", "orders.work")
    assert names.is_flow_member("orders.work.p1", "orders.work")
