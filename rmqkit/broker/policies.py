"""The settings in effect on a queue, by the broker's own rules: one pure resolver.

A queue's settings come from its x-arguments, the one user policy and the one operator policy
that apply to it, and the broker version's defaults. `plan`, `doctor`, `status`, the parking
commands and (through ``rmqkit.broker.snapshot``) the consumer's wiring check all ask this module,
so they cannot disagree about the same queue. No I/O: the inputs are the management API's JSON.

How the broker does it (read in rabbitmq-server, ``deps/rabbit/src``; re-checked on 3.10.8, 4.0.5
and 4.3.6 by ``tests/integration/test_policies_live.py``):

1. Which policy: ``rabbit_policy:match/2`` keeps the policies whose ``apply-to`` fits the queue's
   type and whose pattern matches its name, sorts them by priority and takes the first; operator
   policies are matched the same way, separately (``match_op``). So at most one user policy and
   one operator policy apply. Equal priorities are "chosen undeterministically" (RabbitMQ docs,
   Policies, "Policy Priorities"); here the greater name wins, so the answer is at least stable.
2. Policy vs operator policy: ``rabbit_policy:get/2`` → ``merge_policy_value/3``; in
   ``rabbit_policies.erl`` (as of 3.10) every numeric key an operator policy may set
   (``expires``, ``message-ttl``, ``max-length``, ``max-length-bytes``, ``max-in-memory-*``,
   ``delivery-limit``) merges with ``min``, and booleans take the operator's value. The 4.x docs
   (Policies, "Conflict Resolution with Regular Policies") add ``overflow`` and ``queue-version``:
   the operator policy's value. On 4.x a negative delivery limit loses to a positive one in this
   merge too (policy -1 + operator 5 → 5, policy 5 + operator -1 → 5: seen on 4.0.5 and 4.3.6).
   Operator policies cannot set dead-letter keys or ``consumer-timeout`` (the broker rejects them).
3. Merged policy vs x-argument: ``rabbit_queue_type_util:args_policy_lookup(Name, Resolve, Q)``
   with a resolver per key and queue type. Quorum (``rabbit_quorum_queue:gather_policy_config``):
   ``min`` for max-length, max-length-bytes, expires, message-ttl; ``policy_has_precedence`` for
   overflow; ``queue_arg_has_precedence`` for the dead-letter keys; delivery-limit with ``min`` on
   3.x and ``resolve_delivery_limit`` on 4.x (a negative value loses to a positive one, else the
   lower). Classic (``rabbit_amqqueue_process:process_args_policy``): ``res_min`` for expires,
   message-ttl, max-length, max-length-bytes; ``res_arg`` (argument wins) for the dead-letter keys,
   overflow, queue-mode, queue-version. Streams: the policy wins (docs: "all stream configuration
   settings"; not re-checked here). ``consumer-timeout`` (3.12+): the lower, as before (not read
   in the source). Keys a policy cannot set (``x-queue-type``, ``x-single-active-consumer``,
   ``x-max-priority``) come from the argument only.
4. Defaults: on 4.0+ a quorum queue without a delivery limit gets 20
   (``?DEFAULT_DELIVERY_LIMIT``), and a negative limit means none; the management API's
   ``delivery_limit`` field reports the result (``unlimited``) on 4.x. 3.x has no default.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

Version = tuple[int, int, int]

QUORUM_DEFAULT_DELIVERY_LIMIT_4X = 20
DEFAULT_SOURCE_4X = "the 4.x default"

# Where the lowest of argument, policy and operator policy wins (rule 3; rule 2 for the merge).
LOWEST_WINS = frozenset(
    {
        "message-ttl",
        "expires",
        "max-length",
        "max-length-bytes",
        "max-in-memory-length",
        "max-in-memory-bytes",
        "consumer-timeout",
    }
)
# The argument wins over the (merged) policy on every queue type but streams.
ARGUMENT_WINS = frozenset(
    {"dead-letter-exchange", "dead-letter-routing-key", "dead-letter-strategy"}
)
# Set by the operator policy over the user policy (4.x docs; 3.x operator policies reject them).
OPERATOR_WINS = frozenset({"overflow", "queue-version"})
# Only an x-argument can set these; a policy value (if one got in) is ignored.
ARGUMENT_ONLY = frozenset({"queue-type", "single-active-consumer", "max-priority"})

_APPLY_TO = {
    "classic": frozenset({"all", "queues", "classic_queues"}),
    "quorum": frozenset({"all", "queues", "quorum_queues"}),
    "stream": frozenset({"all", "queues", "streams"}),
}


@dataclass(frozen=True)
class Policy:
    """A user or operator policy as the management API lists it."""

    name: str
    pattern: str = ""
    definition: Mapping[str, Any] = field(default_factory=dict)
    priority: int = 0
    apply_to: str = "all"

    @classmethod
    def from_api(cls, raw: Mapping[str, Any]) -> Policy:
        """From ``/api/policies`` or ``/api/operator-policies`` JSON (missing fields default)."""
        try:
            priority = int(raw.get("priority", 0) or 0)
        except (TypeError, ValueError):
            priority = 0
        definition = raw.get("definition")
        return cls(
            name=str(raw.get("name", "")),
            pattern=str(raw.get("pattern", "")),
            definition=dict(definition) if isinstance(definition, Mapping) else {},
            priority=priority,
            apply_to=str(raw.get("apply-to", "all") or "all"),
        )

    def applies_to(self, name: str, queue_type: str | None) -> bool:
        """Whether this policy matches queue ``name`` of ``queue_type`` (None: an exchange)."""
        if queue_type is None:
            if self.apply_to not in ("all", "exchanges"):
                return False
        elif self.apply_to not in _APPLY_TO.get(queue_type, _APPLY_TO["classic"]):
            return False
        try:
            return re.search(self.pattern, name) is not None
        except re.error:  # the broker validates patterns; a bad one matches nothing here
            return False


PolicyInput = Policy | Mapping[str, Any]


def as_policy(policy: PolicyInput) -> Policy:
    """``policy`` as a Policy (management API JSON is accepted as is)."""
    return policy if isinstance(policy, Policy) else Policy.from_api(policy)


def applying_policy(
    policies: Iterable[PolicyInput], name: str, queue_type: str | None
) -> Policy | None:
    """The one policy of ``policies`` the broker applies to ``name``: the highest priority
    among those that match (rule 1); ties go to the greater name."""
    matching = [p for p in map(as_policy, policies) if p.applies_to(name, queue_type)]
    if not matching:
        return None
    return max(matching, key=lambda p: (p.priority, p.name))


@dataclass(frozen=True)
class Effective:
    """A queue's settings in effect and where each comes from."""

    settings: dict[str, Any]  # policy-key form ("message-ttl", …), without queue-type
    sources: dict[str, str]  # key → "argument", "policy 'p'", "operator policy 'o'"
    policy: Policy | None
    operator_policy: Policy | None
    # The delivery limit the broker enforces (quorum queues): None = no limit. On 4.x it is
    # the default 20 when nothing sets one, and None for a negative setting.
    delivery_limit: int | None = None
    delivery_limit_source: str = ""


def _number(value: Any) -> int | float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


def _lower_limit(a: int | float, b: int | float, v4: bool) -> int | float:
    # 4.x resolve_delivery_limit (both in the policy merge and against the argument): a
    # negative value (no limit) loses to a non-negative one; otherwise the lower wins.
    if v4 and (a < 0 or b < 0):
        return max(a, b)
    return min(a, b)


def _label(kind: str, policy: Policy | None) -> str:
    return f"{kind} {policy.name!r}" if policy is not None and policy.name else kind


def resolve(
    queue_type: str,
    arguments: Mapping[str, Any],
    policy: PolicyInput | None,
    operator_policy: PolicyInput | None,
    version: Version,
) -> Effective:
    """The settings in effect on a queue of ``queue_type`` with x-``arguments`` (as declared,
    ``x-`` prefixed), given the user and operator policy that apply (None if none)."""
    pol = as_policy(policy) if policy is not None else None
    op = as_policy(operator_policy) if operator_policy is not None else None
    v4 = version >= (4, 0, 0)
    args = {
        key[2:]: value
        for key, value in arguments.items()
        if isinstance(key, str) and key.startswith("x-") and value is not None
    }
    args.pop("queue-type", None)
    pol_def = {k: v for k, v in (pol.definition if pol else {}).items() if v is not None}
    op_def = {k: v for k, v in (op.definition if op else {}).items() if v is not None}
    pol_label, op_label = _label("policy", pol), _label("operator policy", op)
    settings: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for key in sorted(set(args) | set(pol_def) | set(op_def)):
        if key in ARGUMENT_ONLY:
            if key in args:
                settings[key], sources[key] = args[key], "argument"
            continue
        chosen = _resolve_key(key, queue_type, v4, args, pol_def, op_def, pol_label, op_label)
        if chosen is not None:
            sources[key], settings[key] = chosen
    limit, limit_source = None, ""
    if queue_type == "quorum":
        value = _number(settings.get("delivery-limit"))
        if value is None and v4:
            limit, limit_source = QUORUM_DEFAULT_DELIVERY_LIMIT_4X, DEFAULT_SOURCE_4X
        elif value is not None and value >= 0:
            limit, limit_source = int(value), sources["delivery-limit"]
    return Effective(settings, sources, pol, op, limit, limit_source)


def _resolve_key(
    key: str,
    queue_type: str,
    v4: bool,
    args: dict[str, Any],
    pol_def: dict[str, Any],
    op_def: dict[str, Any],
    pol_label: str,
    op_label: str,
) -> tuple[str, Any] | None:
    """(source label, value) of one key, or None when nothing usable sets it."""
    numeric = key in LOWEST_WINS or key == "delivery-limit"
    # Rule 2: the user policy merged with the operator policy.
    merged: tuple[str, Any] | None = None
    if key in pol_def and key in op_def:
        p, o = pol_def[key], op_def[key]
        pn, on = _number(p), _number(o)
        if numeric and pn is not None and on is not None:
            best = _lower_limit(pn, on, v4 and key == "delivery-limit")
            merged = (pol_label, p) if best == pn else (op_label, o)
        else:  # overflow, queue-version, booleans: the operator's value
            merged = (
                (op_label, o) if key in OPERATOR_WINS or isinstance(o, bool) else (pol_label, p)
            )
    elif key in pol_def:
        merged = (pol_label, pol_def[key])
    elif key in op_def:
        merged = (op_label, op_def[key])
    argument = ("argument", args[key]) if key in args else None
    if merged is None or argument is None:
        found = merged or argument
        if found is not None and numeric and _number(found[1]) is None:
            return None  # a non-numeric limit: the broker rejects it; nothing to report
        return found
    # Rule 3: the merged policy value against the argument.
    if queue_type == "stream":
        return merged
    if numeric:
        an, mn = _number(argument[1]), _number(merged[1])
        if an is None or mn is None:
            return argument if an is not None else (merged if mn is not None else None)
        best = _lower_limit(mn, an, v4 and key == "delivery-limit")
        return argument if best == an else merged  # ties: the argument, as the label
    if key == "overflow" and queue_type == "quorum":
        return merged
    return argument  # dead-letter keys, classic overflow and anything else: res_arg


def resolve_queue(
    raw: Mapping[str, Any],
    policies: Iterable[PolicyInput],
    operator_policies: Iterable[PolicyInput],
    version: Version,
) -> Effective:
    """``resolve`` for a queue as ``/api/queues`` lists it, picking its policies from lists."""
    name = str(raw.get("name", ""))
    qtype = str(raw.get("type") or "classic")
    arguments = raw.get("arguments")
    return resolve(
        qtype,
        dict(arguments) if isinstance(arguments, Mapping) else {},
        applying_policy(policies, name, qtype),
        applying_policy(operator_policies, name, qtype),
        version,
    )


__all__ = [
    "ARGUMENT_ONLY",
    "ARGUMENT_WINS",
    "DEFAULT_SOURCE_4X",
    "LOWEST_WINS",
    "OPERATOR_WINS",
    "QUORUM_DEFAULT_DELIVERY_LIMIT_4X",
    "Effective",
    "Policy",
    "PolicyInput",
    "Version",
    "applying_policy",
    "as_policy",
    "resolve",
    "resolve_queue",
]
