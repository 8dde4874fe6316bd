"""Every place rmqkit removes a message from a queue, each shown to write its copy first.

Issue 9 asked for "a grep of the code for every place that acks or purges after writing somewhere
else, each shown to write first". This is that grep, kept: it walks every module of ``rmqkit``,
finds each call that settles a delivery (ack, reject, nack, purge, delete) or marks one for
acking (the consumer's tracker, the browse's TAKE / truthy settlement), and compares the set with
the audited table below. A new site fails this test until it is added here with what makes it
safe and the test that shows it. The ordering assertions at the end check, in the source, that
each copy-then-ack site acks only after the copy is durable.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SETTLING = {
    "basic_ack",
    "basic_reject",
    "basic_nack",
    "ack",  # rmqkit.broker.channel.Channel's settling methods
    "reject",
    "nack",
    "queue_purge",
    "queue_delete",
    "finished",
    "_finished",
    "take",
    "set_result",
}

# (module, the line as written) -> why it is safe; the test that proves it.
AUDITED: dict[tuple[str, str], str] = {
    # --- consumer -----------------------------------------------------------------------------
    ("consumer/acks.py", "await channel.ack(last, multiple=True)"): (
        "acks the finished prefix only (AckTracker.take_acks); a tag is finished after its "
        "handler succeeded or its copy was confirmed — test_consume.py mixed outcomes, "
        "test_acks_and_config"
    ),
    ("consumer/acks.py", "await asyncio.gather(*[channel.ack(tag) for tag in alone])"): (
        "acks, one by one, finished tags past an unfinished one (AckTracker.take_acks), never "
        "the unfinished one — test_settle.py slow message, test_acks_and_config"
    ),
    ("consumer/dispatch.py", "self._finished(tracker, tag)"): (
        "after Success or an Ack decision: nothing to write elsewhere (the effect is the "
        "handler's); with --dedupe Success (applied, duplicate or stale) comes only after the "
        "store's COMMIT returned — test_dedupe_consume.py kill -9 three ways"
    ),
    ("consumer/dispatch.py", "tracker.finished(tag)"): "the one body of _finished",
    ("consumer/copies.py", "self._finished(tracker, tag)"): (
        "only when the retry/park copy's outcome is Outcome.CONFIRMED (asserted below) — "
        "test_consume.py returned copies, test_consume_43.py refused copies"
    ),
    ("consumer/copies.py", "await channel.reject(tag, requeue=True)"): (
        "puts the original BACK (requeue) when its copy was refused: nothing removed"
    ),
    ("consumer/runner.py", "cancelled.set_result(tag)"): (
        "a broker basic.cancel seen: a signal to reconnect, settles no delivery"
    ),
    # --- parking browse (list, stats, replay, purge, export) -----------------------------------
    ("parking/browse.py", "await self.channel.ack(last, multiple=True)"): (
        "acks only tags a visitor took (TAKE) or whose settlement resolved truthy"
    ),
    ("parking/browse.py", "await self.channel.ack(tag)"): "same, one by one past a gap",
    ("parking/browse.py", "acks.take(tag)"): (
        "TAKE, or a settlement future whose result is truthy (Outcome.CONFIRMED for replay, "
        "True for export only after the file is fsynced and in place)"
    ),
    ("parking/browse.py", "elif verdict is Verdict.TAKE:"): "see acks.take",
    ("parking/browse.py", "await channel.nack(last_kept, multiple=True, requeue=True)"): (
        "returns every kept message at the end of a pass (up to the highest kept tag; those "
        "after it were all taken and acked): nothing removed — test_browse.py "
        "last-message-taken"
    ),
    ("parking/ops.py", "return Verdict.TAKE"): (
        "purge: the deletion itself, only of what the operator counted/confirmed — "
        "test_parking_operator.py interactive purge"
    ),
    ("parking/transfer.py", "future.set_result(ok)"): (
        "export --remove: ok is True only after out.sync(publish=True) (asserted below) — "
        "test_file_safety.py full disk"
    ),
    # --- rmqkit.broker.channel: the client's calls behind Channel.ack/nack/reject --------------
    ("broker/channel.py", "return self._raw.basic_ack(delivery_tag, multiple=multiple)"): (
        "a delegation: each call of Channel.ack is audited where it is made"
    ),
    (
        "broker/channel.py",
        "return self._raw.basic_nack(delivery_tag, multiple=multiple, requeue=requeue)",
    ): "a delegation: each call of Channel.nack is audited where it is made",
    ("broker/channel.py", "return self._raw.basic_reject(delivery_tag, requeue=requeue)"): (
        "a delegation: each call of Channel.reject is audited where it is made"
    ),
    # --- dedupe workers: verdicts handed back to the dispatcher, which acks through _finished ----
    ("idempotency/work.py", "self.future.set_result((verdict, outcome))"): (
        "a worker's verdict for one delivery, set only after its batch's COMMIT returned (or the "
        "rollback: ROLLED_BACK → the retry/park decision) — test_idempotency_workers.py"
    ),
    ("idempotency/workers.py", "claim.future.set_result((batch, fresh))"): (
        "hands the claim (new id or duplicate) to the delivery; its verdict waits for the "
        "batch's COMMIT (Batch.committed) — test_idempotency_workers.py"
    ),
    # --- outcome hooks: called after the delivery was settled, never settle one --------------
    ("consumer/hooks.py", "result.set_result(value)"): (
        "a def hook's return value, handed from its thread to the hook runner; the delivery it"
        " reports on was settled before the hook was called — test_hooks.py"
    ),
    # --- publisher confirms: these settle publishes, not deliveries ----------------------------
    ("broker/confirms.py", "outcome.set_result(Outcome.NACKED)"): "a publish's outcome",
    ("broker/confirms.py", "outcome.set_result(Outcome.CONFIRMED)"): "a publish's outcome",
    ("broker/confirms.py", "pending.outcome.set_result(Outcome.RETURNED)"): "a publish's outcome",
    # --- conflation (consume --conflate-key-header, issue 15) ----------------------------------
    ("consumer/conflation.py", "state.waiting.set_result(False)  # replaced by this newer one"): (
        "the superseded message is acked unhandled, by design: a newer message with the same key "
        "is already held by this consumer and is handled next (test_conflation: the newest of "
        "every key is always handled, every message acked, nothing parked)"
    ),
    (
        "consumer/conflation.py",
        "waiting.set_result(True)  # still the key's turn: the waiting one runs next",
    ): "hands the key's turn to the waiting message; settles nothing",
}


def _settling_sites() -> set[tuple[str, str]]:
    found = set()
    package = ROOT / "rmqkit"
    for path in sorted(package.rglob("*.py")):
        source = path.read_text()
        lines = source.splitlines()
        module = path.relative_to(package).as_posix()
        for node in ast.walk(ast.parse(source)):
            called = (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in SETTLING
            )
            taken = isinstance(node, ast.Attribute) and node.attr == "TAKE"
            if called or taken:
                found.add((module, lines[node.lineno - 1].strip()))
    return found


def test_every_site_that_removes_a_message_is_audited() -> None:
    found = _settling_sites()
    assert found - AUDITED.keys() == set(), "new settling site(s): audit them here"
    assert AUDITED.keys() - found == set(), "audited site(s) gone: update the table"


def _source(module: str) -> str:
    return (ROOT / "rmqkit" / module).read_text()


def test_each_copy_is_durable_before_its_original_is_acked() -> None:
    # consumer: a retry/park original is finished only on a confirmed copy
    copies = _source("consumer/copies.py")
    assert re.search(
        r"if outcome is Outcome\.CONFIRMED:\n\s+self\._finished\(tracker, tag\)", copies
    )
    assert copies.count("self._finished(") == 1
    # replay: the browse acks a settlement only when it resolves truthy, and Outcome is truthy
    # only for CONFIRMED
    browse = _source("parking/browse.py")
    assert re.search(
        r"future\.exception\(\) is None and future\.result\(\):\n\s+.*\n\s+acks\.take", browse
    )
    from rmqkit.broker.confirms import Outcome

    assert [bool(o) for o in Outcome] == [o is Outcome.CONFIRMED for o in Outcome]
    # export --remove: a True settlement follows a successful sync(publish=True)
    transfer = _source("parking/transfer.py")
    assert re.search(
        r"out\.sync\(publish=True\)\n.*?settle_batch\(not failure\)", transfer, re.DOTALL
    )
    # import: a record enters the journal only on a confirmed publish
    assert re.search(r"Outcome\.CONFIRMED:\n.*?journal\.add\(slot, digest\)", transfer, re.DOTALL)
