"""Doctor checks of messages in flight: transient messages a restart loses, unroutable
publishes dropped, queues growing with nobody consuming (docs/doctor.md:
transient-messages, unroutable-dropped, growing-without-consumers).

The first two need the broker's message counts and stats: where it keeps none
(management.disable_stats) they are skipped, not passed."""

from __future__ import annotations

from rmqkit.broker.snapshot import QueueView, count
from rmqkit.health.checks.common import plain_queues
from rmqkit.health.findings import CheckSkipped, DoctorInput, Finding


# --- 6. transient messages in durable queues -------------------------------------------------
def transient_messages(inp: DoctorInput) -> list[Finding]:
    """A durable classic queue survives a restart; its transient (delivery_mode 1) messages do
    not. Quorum queues (and streams) persist every message: never a finding there.

    Management counters lag while messages arrive (``messages`` can count a publish that
    ``messages_persistent`` does not yet): a queue is reported only if its second read
    (``inp.transient_reread``, a stats interval later) still shows transient messages."""
    if inp.snapshot.stats_disabled:
        raise CheckSkipped("the broker keeps no message counts (management.disable_stats)")
    found: list[Finding] = []
    for queue in transient_candidates(inp):
        total, persistent = queue.messages or 0, queue.messages_persistent or 0
        reads = ""
        if inp.transient_reread is not None:
            again = inp.transient_reread.get(queue.name)
            if again is None or transient_count(*again) == 0:
                continue  # gone, or the first read was counters mid-update
            total, persistent = again[0] or 0, again[1] or 0
            reads = " on two reads of the counters"
        found.append(
            Finding(
                "transient-messages",
                "warning",
                "queue",
                queue.name,
                f"{total - persistent} of {total} message(s) in this durable {queue.type} queue "
                f"are transient (delivery_mode 1){reads}: they are lost when the node restarts",
                "publish with delivery_mode 2 (persistent; `rmqkit publish` does), or use a "
                "quorum queue, which persists every message",
            )
        )
    return found


def transient_candidates(inp: DoctorInput) -> list[QueueView]:
    """Durable classic queues whose first read counts transient messages."""
    return [
        queue
        for queue in plain_queues(inp)
        if queue.durable
        and queue.type == "classic"
        and transient_count(queue.messages, queue.messages_persistent) > 0
    ]


def transient_count(total: int | None, persistent: int | None) -> int:
    """Transient messages the counters show (0 where either is unknown)."""
    if total is None or persistent is None:
        return 0
    return max(0, total - persistent)


# --- 7. unroutable publishes with no alternate exchange --------------------------------------
def unroutable_dropped(inp: DoctorInput) -> list[Finding]:
    """Messages published without ``mandatory`` that no queue takes are dropped silently
    unless the exchange has an alternate exchange."""
    snapshot = inp.snapshot
    if not snapshot.rates_kept:
        raise CheckSkipped("the broker keeps no message stats (management.disable_stats)")
    stats = snapshot.vhost_stats or {}
    dropped = count(stats.get("drop_unroutable")) or 0
    if dropped == 0:
        return []
    found: list[Finding] = []
    for name, exchange in sorted(snapshot.exchanges.items()):
        if name == "" or snapshot.exchange_setting(name, "alternate-exchange"):
            continue
        xstats = exchange.get("message_stats") or {}
        published = count(xstats.get("publish_in")) or 0
        routed = count(xstats.get("publish_out")) or 0
        if published <= routed:
            continue
        found.append(
            Finding(
                "unroutable-dropped",
                "warning",
                "exchange",
                name,
                f"{published} message(s) published to it, {routed} routed to a queue, no "
                f"alternate-exchange; the vhost dropped {dropped} unroutable message(s) "
                "published without mandatory (counts since the stats were last reset)",
                "bind a queue for those routing keys, or set an alternate exchange (policy key "
                "alternate-exchange → an exchange bound to a catch-all queue), or publish with "
                "mandatory and handle returns (`rmqkit publish` does)",
            )
        )
    if not found:
        found.append(
            Finding(
                "unroutable-dropped",
                "warning",
                "vhost",
                snapshot.vhost,
                f"the vhost dropped {dropped} unroutable message(s) published without "
                "mandatory (the exchange is not identifiable from its stats)",
                "publish with mandatory and handle returns, or give the exchanges an alternate "
                "exchange (policy key alternate-exchange)",
            )
        )
    return found


# --- 8. a queue growing with no consumers ----------------------------------------------------
def growing_without_consumers(inp: DoctorInput) -> list[Finding]:
    """Ready messages, no consumer, and still being published to (or growing between two
    reads). Wait, parking and archive queues and delay ladder rungs have no consumers by
    design and are left out."""
    found: list[Finding] = []
    for queue in plain_queues(inp):
        if inp.role(queue.name) in ("wait", "parking", "archive", "delay"):
            continue
        # A sample (AMQP, immediate) beats the management counts, which lag.
        sample = inp.ready_samples.get(queue.name)
        ready = sample[1] if sample is not None else queue.ready
        if not ready or queue.consumers not in (0, None):
            continue
        signs: list[str] = []
        publish = queue.publish_rate
        if publish:
            signs.append(f"published at {publish:.2f}/s")
        growth = queue.growth_rate
        if growth and growth > 0:
            signs.append(f"growing at {growth:.2f}/s")
        if sample is not None and sample[1] > sample[0]:
            signs.append(f"ready went {sample[0]} → {sample[1]} in {inp.sample_interval_s:g}s")
        if not signs:
            continue
        found.append(
            Finding(
                "growing-without-consumers",
                "warning",
                "queue",
                queue.name,
                f"{ready} ready message(s), no consumer, " + ", ".join(signs),
                f"start its consumer (`rmqkit consume MODULE:HANDLER --queue {queue.name}`); "
                "if nothing should consume it, unbind it or bound it (max-length with "
                "overflow reject-publish) before it fills the node",
            )
        )
    return found
