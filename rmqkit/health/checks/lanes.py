"""Doctor checks of the lanes' bounds: a parking queue keeps every message until an operator
acts, and a work queue is bounded before it fills the node (docs/doctor.md:
parking-limit-or-ttl, unbounded-work-queue)."""

from __future__ import annotations

from rmqkit.broker.policies import DEFAULT_SOURCE_4X
from rmqkit.health.checks.common import ms_text
from rmqkit.health.findings import DoctorInput, Finding


# --- 4. parking queue with a delivery limit or a TTL ----------------------------------------
def parking_limit_or_ttl(inp: DoctorInput) -> list[Finding]:
    """A parking queue must keep every message until an operator acts: no TTL, no expiry,
    no delivery limit (browsing spends attempts), no bound that drops from the head."""
    found: list[Finding] = []
    v4 = inp.snapshot.version >= (4, 0, 0)
    for queue in inp.queues_with_role("parking"):
        settings = queue.settings
        problems: list[str] = []
        if settings.get("message-ttl") is not None:
            problems.append(
                f"message-ttl {ms_text(settings['message-ttl'])} ({queue.source('message-ttl')}): "
                "parked messages expire"
            )
        if settings.get("expires") is not None:
            problems.append(
                f"expires {ms_text(settings['expires'])} ({queue.source('expires')}): the queue "
                "is deleted, with its messages, once unused that long"
            )
        if queue.type == "quorum":
            limit = queue.delivery_limit
            if limit is not None and queue.delivery_limit_source == DEFAULT_SOURCE_4X:
                problems.append(
                    f"no delivery-limit, so the 4.x default {limit} "
                    "applies: each browse (`rmqkit parking list/replay`) spends an attempt"
                )
            elif limit is not None:
                problems.append(
                    f"delivery-limit {limit} ({queue.delivery_limit_source}): each browse "
                    "(`rmqkit parking list/replay`) spends an attempt, and rmqkit refuses to "
                    "browse it"
                )
        bounded = settings.get("max-length") is not None or (
            settings.get("max-length-bytes") is not None
        )
        if bounded and settings.get("overflow", "drop-head") == "drop-head":
            problems.append(
                "a length bound with overflow drop-head: the oldest parked messages are "
                "dropped when it fills"
            )
        if not problems:
            continue
        found.append(
            Finding(
                "parking-limit-or-ttl",
                "critical",
                "queue",
                queue.name,
                "parking queue with " + "; ".join(problems),
                "remove them — a parking queue keeps messages until someone replays or purges "
                "them"
                + (" (on 4.x set delivery-limit -1, as `rmqkit declare` does)" if v4 else "")
                + "; policy keys go with the policy, x-arguments only by moving the messages "
                "out (`rmqkit parking export --remove`) and redeclaring",
            )
        )
    return found


# --- 9. no length bound on work queues -------------------------------------------------------
def unbounded_work_queue(inp: DoctorInput) -> list[Finding]:
    """A work queue with no max-length / max-length-bytes grows until an alarm blocks every
    publisher on the node, not just the ones of the stalled queue."""
    found: list[Finding] = []
    for queue in inp.queues_with_role("work"):
        if "max-length" in queue.settings or "max-length-bytes" in queue.settings:
            continue
        found.append(
            Finding(
                "unbounded-work-queue",
                "warning",
                "queue",
                queue.name,
                "work queue (it dead-letters into a parking queue) with no max-length or "
                "max-length-bytes: if its consumers stall it grows until a memory or disk "
                "alarm blocks every publisher on the node",
                "set max_length (or max_length_bytes) for it in the topology file and run "
                "`rmqkit declare` (policy key max-length with overflow reject-publish: "
                "producers get a nack they can retry instead of losing the oldest message)",
            )
        )
    return found
