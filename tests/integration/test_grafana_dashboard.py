"""docs/grafana/rmqkit.json names only series that exist, and filters them the way it says.

Every PromQL expression of the dashboard (each panel's queries, the panels nested in rows
included, and the template variables' queries) is read by a small extractor (``selectors``;
tests/unit/test_grafana_queries.py tests it) into the series it selects. Each name must be
exported, with a sample and with the labels the query filters on:

- the ``rabbitmq_`` ones by RabbitMQ's Prometheus plugin on the endpoint the dashboard expects,
  ``/metrics/detailed`` with the families in ``DETAILED_FAMILIES`` (docs/observability.md says
  so), for the queues of a topology declared in a fresh vhost;
- every other one by a real ``rmqkit consume`` worker's ``/metrics`` (``--metrics-port``), after
  it has acked, retried and parked messages.

The broker's endpoint may be missing (the rabbitmq_prometheus plugin not enabled; scripts/broker-up
enables it on the host's node): that test then skips and says why. An unknown name fails.
"""

from __future__ import annotations

import asyncio
import difflib
import json
import os
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aio_pika
import httpx
import jsonschema
import pytest

from rmqkit.settings import with_vhost
from tests import broker
from tests.consumer_harness import ConsumerProcess, effects, wait_until
from tests.handlers import body
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs" / "grafana" / "rmqkit.json"
OBSERVABILITY = ROOT / "docs" / "observability.md"
WORK, PARKING = "jobs.work", "jobs.work.parking"

# What the dashboard expects Prometheus to scrape from each RabbitMQ node (docs/observability.md).
DETAILED_PATH = "/metrics/detailed"
DETAILED_FAMILIES = ("queue_coarse_metrics", "queue_consumer_count")
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

# Series a healthy consumer declares (a # TYPE line) but has no sample of until something goes
# wrong; the others must have a sample after the deliveries below.
EMPTY_UNTIL_TROUBLE = frozenset({"rmqkit_consumer_copies_refused_total"})


# --- the extractor ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Selector:
    """One vector selector of an expression: the metric name and its label matchers' text
    (between the braces; empty when it has none)."""

    name: str
    matchers: str = ""

    def label_names(self) -> set[str]:
        """The labels the matchers test (``__name__`` excepted)."""
        unquoted = _STRING.sub('""', self.matchers)
        return {label for label, _ in _MATCHER.findall(unquoted)} - {"__name__"}


_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_NUMBER = re.compile(r"0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_DURATION = re.compile(r"-?(?:\d+(?:ms|[smhdwy]))+")
_GRAFANA_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+|\[\[\w+(?::\w+)?\]\]")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)")
_NAME_MATCHER = re.compile(r"__name__\s*(=~|!~|!=|=)\s*(\"(?:[^\"\\]|\\.)*\"|'[^']*'|`[^`]*`)")
# Binary operators and modifiers spelled as words; they are no metric.
_KEYWORDS = frozenset(
    {"and", "or", "unless", "atan2", "bool", "offset", "inf", "nan", "group_left", "group_right"}
)
# Words followed by a parenthesised list of label names (not an expression).
_LABEL_LISTS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
_AGGREGATIONS = frozenset(
    {
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
        "limitk",
        "limit_ratio",
    }
)


def selectors(expr: str) -> list[Selector]:
    """The vector selectors of a PromQL expression, in order, as the dashboard writes them.

    Skipped: functions and aggregations (a word before ``(``), ``by``/``without``/``on``/
    ``ignoring``/``group_left``/``group_right`` and their label lists, string literals, numbers,
    range and subquery brackets (``[5m]``, ``[7d:5m]``) and ``offset`` durations, keyword
    operators (``and``, ``bool`` …), comments, and Grafana's variables (``$__rate_interval``,
    ``${queue}``, ``[[queue]]``). A selector written only as ``{__name__="x"}`` is named by that
    matcher. Raises ValueError on what it cannot read: unbalanced brackets or quotes, a selector
    without a literal metric name."""
    found: list[Selector] = []
    pending: int | None = None  # index in found of a name whose {matchers} may follow
    n = len(expr)

    def skip_string(i: int) -> int:
        quote, j = expr[i], i + 1
        while j < n:
            if expr[j] == "\\" and quote != "`":
                j += 2
                continue
            if expr[j] == quote:
                return j + 1
            j += 1
        raise ValueError(f"unterminated string in {expr!r}")

    def skip_group(i: int) -> int:
        opening = expr[i]
        closing = {"(": ")", "[": "]", "{": "}"}[opening]
        depth, j = 0, i
        while j < n:
            char = expr[j]
            if char in "\"'`":
                j = skip_string(j)
                continue
            if char == opening:
                depth += 1
            elif char == closing:
                depth -= 1
                if depth == 0:
                    return j + 1
            j += 1
        raise ValueError(f"unbalanced {opening!r} in {expr!r}")

    def spaces(i: int) -> int:
        while i < n and expr[i].isspace():
            i += 1
        return i

    i = 0
    while i < n:
        char = expr[i]
        if char.isspace():
            i += 1
            continue
        variable = _GRAFANA_VARIABLE.match(expr, i) if char in "$[" else None
        if variable:
            i, pending = variable.end(), None
        elif char in "\"'`":
            i, pending = skip_string(i), None
        elif char == "#":
            end = expr.find("\n", i)
            i = n if end < 0 else end
        elif char == "{":
            end = skip_group(i)
            matchers = expr[i + 1 : end - 1]
            if pending is not None:
                found[pending] = Selector(found[pending].name, matchers)
            else:
                found.append(Selector(_named_by_matcher(matchers, expr), matchers))
            i, pending = end, None
        elif char == "[":
            i, pending = skip_group(i), None
        elif char.isdigit() or (char == "." and i + 1 < n and expr[i + 1].isdigit()):
            number = _NUMBER.match(expr, i)
            assert number is not None
            i, pending = number.end(), None
        elif word := _IDENT.match(expr, i):
            name, i, pending = word.group(), word.end(), None
            after = spaces(i)
            lower = name.lower()
            following = _IDENT.match(expr, after)
            if lower in _LABEL_LISTS and after < n and expr[after] == "(":
                i = skip_group(after)
            elif lower == "offset":
                duration = _DURATION.match(expr, after)
                if duration is None:
                    raise ValueError(f"offset without a duration in {expr!r}")
                i = duration.end()
            elif lower in _KEYWORDS:
                pass
            elif after < n and expr[after] == "(":
                pass  # a function or an aggregation: its arguments come next
            elif lower in _AGGREGATIONS and following and following.group() in ("by", "without"):
                pass  # sum by (le) (...): the clause comes next
            else:
                found.append(Selector(name))
                pending = len(found) - 1
        else:
            i, pending = i + 1, None  # operators, parentheses, commas, @
    return found


def _named_by_matcher(matchers: str, expr: str) -> str:
    """The metric name of a selector written without one: its ``__name__="…"`` matcher."""
    match = _NAME_MATCHER.search(matchers)
    if match is None:
        raise ValueError(f"a selector without a metric name in {expr!r}")
    if match.group(1) != "=":
        raise ValueError(f"a metric name matched by {match.group(1)}, not checkable: {expr!r}")
    return match.group(2)[1:-1]


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects."""
    return {selector.name for selector in selectors(expr)}


_LABEL_VALUES = re.compile(r"\s*label_values\s*\((?P<args>.*)\)\s*", re.DOTALL)
_QUERY_RESULT = re.compile(r"\s*query_result\s*\((?P<expr>.*)\)\s*", re.DOTALL)
_NO_SERIES = re.compile(r"\s*(label_names|metrics)\s*\(")


def variable_expr(query: str) -> str | None:
    """The PromQL expression in a Prometheus template variable's query, or None when it has none.

    ``label_values(EXPR, label)`` and ``query_result(EXPR)`` give EXPR; ``label_values(label)``,
    ``label_names()`` and ``metrics(regex)`` select no series by name; anything else is a query
    itself."""
    if values := _LABEL_VALUES.fullmatch(query):
        expr, comma, label = values["args"].rpartition(",")
        if not comma:
            return None
        if not _IDENT.fullmatch(label.strip()):
            raise ValueError(f"label_values' last argument is not a label name: {query!r}")
        return expr
    if result := _QUERY_RESULT.fullmatch(query):
        return result["expr"]
    if _NO_SERIES.match(query):
        return None
    return query


# --- the dashboard ---------------------------------------------------------------------------


def load_dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return data


def walk_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, rows and the panels a (collapsed) row holds included."""
    for panel in panels:
        yield panel
        yield from walk_panels(panel.get("panels", []))


def panel_queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any], str]]:
    """(panel title, target, expression) for every panel query."""
    for panel in walk_panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            yield panel.get("title", "?"), target, target.get("expr", "")


def variable_queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(variable name, expression) for every query variable that selects series."""
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"]
        text = query.get("query", "") if isinstance(query, dict) else query
        expr = variable_expr(text)
        if expr is not None:
            yield variable["name"], expr


def dashboard_selectors(dashboard: dict[str, Any]) -> list[tuple[str, Selector]]:
    """(where, selector) for every selector of the dashboard's queries and variables."""
    found = [
        (f"panel {title!r}", selector)
        for title, _, expr in panel_queries(dashboard)
        for selector in selectors(expr)
    ]
    found += [
        (f"variable ${name}", selector)
        for name, expr in variable_queries(dashboard)
        for selector in selectors(expr)
    ]
    return found


def uses_variable(text: str, name: str) -> bool:
    """Whether ``text`` refers to the Grafana variable ``name`` ($name, ${name…}, [[name…]])."""
    return bool(re.search(rf"\$\b{name}\b|\$\{{{name}(:[^}}]*)?\}}|\[\[{name}(:\w+)?\]\]", text))


# The shape Grafana (schemaVersion 39) needs to import the file: what is checked beside the
# queries below.
DASHBOARD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["title", "uid", "schemaVersion", "panels", "templating", "time"],
    "properties": {
        "title": {"type": "string", "minLength": 1},
        "uid": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,40}$"},
        "schemaVersion": {"type": "integer", "minimum": 36},
        "panels": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/panel"}},
        "templating": {
            "type": "object",
            "required": ["list"],
            "properties": {
                "list": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name", "type"],
                        "properties": {"type": {"enum": ["datasource", "query", "custom"]}},
                    },
                }
            },
        },
        "time": {"type": "object", "required": ["from", "to"]},
    },
    "$defs": {
        "panel": {
            "type": "object",
            "required": ["id", "type", "title", "gridPos"],
            "properties": {
                "id": {"type": "integer"},
                "type": {"enum": ["row", "timeseries", "stat"]},
                "gridPos": {
                    "type": "object",
                    "required": ["h", "w", "x", "y"],
                    "properties": {"w": {"type": "integer", "minimum": 1, "maximum": 24}},
                },
                "panels": {"type": "array", "items": {"$ref": "#/$defs/panel"}},
                "targets": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["refId", "expr"],
                        "properties": {"expr": {"type": "string", "minLength": 1}},
                    },
                },
            },
        }
    },
}


def test_the_dashboard_is_importable_grafana_json() -> None:
    dashboard = load_dashboard()
    jsonschema.validate(dashboard, DASHBOARD_SCHEMA)
    ids = [panel["id"] for panel in walk_panels(dashboard["panels"])]
    assert len(ids) == len(set(ids)), f"panel ids repeat: {sorted(ids)}"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["queue"]["type"] == "query"
    assert not variables["queue"].get("multi") and not variables["queue"].get("includeAll"), (
        "the queries compare queue= with one work queue"
    )
    assert variables["vhost"]["type"] == "query"


def test_every_panel_has_a_title_and_the_datasource_variable() -> None:
    dashboard = load_dashboard()
    for panel in walk_panels(dashboard["panels"]):
        assert panel.get("title", "").strip(), f"panel {panel['id']} has no title"
        if panel["type"] == "row":
            continue
        assert panel.get("datasource") == DATASOURCE, panel["title"]
        assert panel.get("targets"), f"panel {panel['title']!r} has no query"
        for target in panel["targets"]:
            assert target.get("datasource") == DATASOURCE, (panel["title"], target["refId"])
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            assert variable.get("datasource") == DATASOURCE, variable["name"]


def test_every_query_selects_the_work_queue() -> None:
    """Each series is filtered on the $queue variable (rmqkit's by ``queue`` or the messaging
    conventions' ``messaging_destination_name``, RabbitMQ's by queue name), RabbitMQ's on $vhost
    too: a panel never mixes in another work queue's numbers."""
    dashboard = load_dashboard()
    for title, target, expr in panel_queries(dashboard):
        found = selectors(expr)
        assert found, f"panel {title!r} {target['refId']}: no series in {expr!r}"
        for selector in found:
            assert uses_variable(selector.matchers, "queue"), (title, selector)
            if selector.name.startswith("rabbitmq_"):
                assert uses_variable(selector.matchers, "vhost"), (title, selector)


def test_the_docs_name_the_endpoint_this_test_scrapes() -> None:
    docs = OBSERVABILITY.read_text(encoding="utf-8")
    assert DETAILED_PATH in docs
    for family in DETAILED_FAMILIES:
        assert family in docs, family
    assert "docs/grafana/rmqkit.json" in docs or "grafana/rmqkit.json" in docs


# --- what is really exported -----------------------------------------------------------------


@dataclass
class Exposition:
    """A /metrics body: sample names with the label names seen on them, and declared names."""

    sampled: dict[str, set[str]]
    declared: set[str]


_SAMPLE = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)(\{.*\})?\s+\S+")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="(?:[^"\\]|\\.)*"')
_SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("", "_sum", "_count")}


def parse_exposition(text: str) -> Exposition:
    """The Prometheus text format (0.0.4), as far as names and label names go. A ``# TYPE``
    line declares its family's sample names (a histogram's ``_bucket``/``_sum``/``_count``)."""
    sampled: dict[str, set[str]] = {}
    declared: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split(maxsplit=3)
            declared.update(family + suffix for suffix in _SUFFIXES.get(kind.strip(), ("",)))
        elif line and not line.startswith("#"):
            sample = _SAMPLE.match(line)
            if sample is None:
                raise ValueError(f"not a sample line: {line!r}")
            labels = set(_LABEL.findall(sample.group(2) or ""))
            sampled.setdefault(sample.group(1), set()).update(labels)
    return Exposition(sampled, declared)


def problems(
    wanted: list[tuple[str, Selector]], exposition: Exposition, may_be_empty: frozenset[str]
) -> list[str]:
    """What the exposition lacks for these selectors: a name, a sample, a label filtered on."""
    found = []
    for where, selector in wanted:
        name = selector.name
        if name in exposition.sampled:
            missing = selector.label_names() - exposition.sampled[name]
            if missing:
                found.append(f"{where}: {name} has no label {', '.join(sorted(missing))}")
        elif name in exposition.declared and name in may_be_empty:
            continue
        elif name in exposition.declared:
            found.append(f"{where}: {name} is declared but has no sample")
        else:
            near = difflib.get_close_matches(
                name, sorted({*exposition.sampled, *exposition.declared})
            )
            hint = f" (close: {', '.join(near)})" if near else ""
            found.append(f"{where}: {name} is not exported{hint}")
    return sorted(set(found))


def from_broker(selector: Selector) -> bool:
    return selector.name.startswith("rabbitmq_")


async def _publish_timestamped(vhost: str, messages: list[tuple[str, bytes]]) -> None:
    """Publish to jobs/job with confirms, each with its message id and an AMQP timestamp (what
    the consumer's message-age histogram reads)."""
    conn = await aio_pika.connect(with_vhost(broker.BASE_URL, vhost))
    try:
        channel = await conn.channel(on_return_raises=True)
        exchange = await channel.get_exchange("jobs")
        for message_id, payload in messages:
            await exchange.publish(
                aio_pika.Message(
                    payload,
                    message_id=message_id,
                    timestamp=datetime.now(tz=UTC),
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                ),
                routing_key="job",
                mandatory=True,
            )
    finally:
        await conn.close()


@pytest.mark.broker
def test_rmqkit_series_are_exported_by_a_real_consumer(
    jobs_vhost: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    wanted = [(w, s) for w, s in dashboard_selectors(load_dashboard()) if not from_broker(s)]
    assert wanted
    ok = [uuid.uuid4().hex for _ in range(5)]
    retried, parked = uuid.uuid4().hex, uuid.uuid4().hex
    messages = [(m, body(id=m)) for m in ok]
    messages += [(retried, body(id=retried, fail=1)), (parked, body(id=parked, permanent=True))]
    asyncio.run(_publish_timestamped(jobs_vhost, messages))
    port = free_port()
    ledger = tmp_path / "ledger.db"
    consumer = ConsumerProcess(jobs_vhost, ledger, "--metrics-port", str(port))
    consumers.append(consumer)
    url = f"http://127.0.0.1:{port}"

    def handled() -> bool:
        done = effects(ledger)
        return all(done[m] == 1 for m in [*ok, retried])

    assert wait_until(handled, timeout_s=30), consumer.output()
    assert wait_until(lambda: broker.depths(jobs_vhost, [PARKING])[PARKING] == 1, 15)

    scraped: list[Exposition] = []

    def complete() -> bool:
        try:
            response = httpx.get(url + "/metrics", timeout=5)
        except httpx.HTTPError:
            return False
        scraped[:] = [parse_exposition(response.text)]
        return not problems(wanted, scraped[0], EMPTY_UNTIL_TROUBLE)

    wait_until(complete, timeout_s=10, interval_s=0.5)
    assert scraped, f"{url}/metrics never answered\n{consumer.output()}"
    found = problems(wanted, scraped[0], EMPTY_UNTIL_TROUBLE)
    assert not found, "\n".join(found)
    assert consumer.stop() == 0


def _prometheus_url() -> str | None:
    """Where the broker under test serves rabbitmq_prometheus: RMQKIT_TEST_PROMETHEUS_URL, else
    port 15692 of the management API's host when that is the default node's (port 15672)."""
    if url := os.environ.get("RMQKIT_TEST_PROMETHEUS_URL"):
        return url.rstrip("/")
    parts = urlsplit(broker.MGMT)
    if parts.port not in (None, 15672):
        return None
    return f"http://{parts.hostname}:15692"


@pytest.mark.broker
def test_rabbitmq_series_are_exported_by_the_prometheus_plugin(jobs_vhost: str) -> None:
    wanted = [(w, s) for w, s in dashboard_selectors(load_dashboard()) if from_broker(s)]
    assert wanted
    base = _prometheus_url()
    if base is None:
        pytest.skip(
            f"no Prometheus endpoint known for the broker under test ({broker.MGMT}):"
            " set RMQKIT_TEST_PROMETHEUS_URL"
        )
    endpoint = base + DETAILED_PATH
    params: dict[str, str | list[str]] = {"vhost": jobs_vhost, "family": [*DETAILED_FAMILIES]}
    try:
        httpx.get(endpoint, params=params, timeout=10)
    except httpx.HTTPError as exc:
        pytest.skip(
            f"RabbitMQ's Prometheus endpoint does not answer at {endpoint} ({exc!r}): enable the"
            " plugin with `rabbitmq-plugins enable rabbitmq_prometheus` (scripts/broker-up does"
            " on the host's node)"
        )
    broker.publish(jobs_vhost, "jobs", "job", [body(id="depth")])  # ready=1 in the work queue

    scraped: list[Exposition] = []

    def complete() -> bool:
        response = httpx.get(endpoint, params=params, timeout=10)
        assert response.status_code == 200, (
            f"{endpoint}: HTTP {response.status_code}; the dashboard needs RabbitMQ 3.10 or later"
        )
        scraped[:] = [parse_exposition(response.text)]
        # The node publishes a queue's numbers every collect_statistics_interval (5 s).
        return WORK in response.text and not problems(wanted, scraped[0], frozenset())

    wait_until(complete, timeout_s=30, interval_s=1)
    found = problems(wanted, scraped[0], frozenset())
    assert not found, "\n".join(found)
