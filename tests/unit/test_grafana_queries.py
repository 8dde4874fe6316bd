"""The PromQL name extractor that tests/integration/test_grafana_dashboard.py checks the Grafana
dashboard with: what it keeps (metric names, their matchers) and what it strips."""

from __future__ import annotations

import pytest

from tests.integration.test_grafana_dashboard import (
    Selector,
    metric_names,
    parse_exposition,
    selectors,
    uses_variable,
    variable_expr,
)


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("up", {"up"}),
        ('rmqkit_consumer_connected{queue="$queue"}', {"rmqkit_consumer_connected"}),
        (
            'sum by (tier) (rate(rmqkit_consumer_retried_total{queue="$queue"}[$__rate_interval]))',
            {"rmqkit_consumer_retried_total"},
        ),
        (
            "histogram_quantile(0.99, sum by (le, rmqkit_outcome) (rate("
            'messaging_process_duration_seconds_bucket{messaging_destination_name="$queue"}[5m])))',
            {"messaging_process_duration_seconds_bucket"},
        ),
        # aggregation clause after the argument list, numbers with exponents, offset
        ("sum(rate(a_total[1h30m] offset 1d)) without (instance) * 1e3 / 0x10", {"a_total"}),
        # subquery, comparison with bool, keyword operators
        (
            'time() - max_over_time(timestamp(b{q="x"} == bool 0)[7d:5m]) and c or d unless e',
            {"b", "c", "d", "e"},
        ),
        # vector matching with label lists, group_left with and without a list
        (
            "x * on (instance) group_left (node) y + ignoring (job) group_right z / on() w",
            {"x", "y", "z", "w"},
        ),
        # strings and label names that look like metrics; a comment
        (
            'label_replace(m{a="b(c)"}, "dst", "$1", "src", "(.*)") # not_a_metric here\n + n',
            {"m", "n"},
        ),
        # Grafana variables outside strings; the old [[var]] form
        ("topk($k, f) > $threshold and g[[[interval]]]", {"f", "g"}),
        # a selector named by its __name__ matcher; recording-rule names with colons
        ('{__name__="named_by_matcher", job="x"} + job:rate5m', {"named_by_matcher", "job:rate5m"}),
        # @ modifiers, inf/nan, count_values' string argument
        ('count_values("v", h @ start()) > -Inf < NaN', {"h"}),
    ],
)
def test_metric_names(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_selectors_keep_their_matchers_in_order() -> None:
    expr = (
        'max by (vhost) (rabbitmq_detailed_queue_messages_ready{vhost=~"$vhost", '
        'queue="$queue.parking"}) / ignoring(x) other {a="}"}'
    )
    assert selectors(expr) == [
        Selector(
            "rabbitmq_detailed_queue_messages_ready", 'vhost=~"$vhost", queue="$queue.parking"'
        ),
        Selector("other", 'a="}"'),
    ]
    assert selectors(expr)[0].label_names() == {"vhost", "queue"}
    assert Selector("x", 'a=~"b=c", b!="", c!~"d"').label_names() == {"a", "b", "c"}


@pytest.mark.parametrize(
    "expr",
    [
        'rate(x{queue="a}[5m])',  # unterminated string
        'x{queue="a"',  # unbalanced braces
        "x[5m",  # unbalanced brackets
        '{job="no name"}',  # no metric name to check
        '{__name__=~"rmqkit_.*"}',  # a name pattern, not a name
        "x offset",  # offset without its duration
    ],
)
def test_unreadable_expressions_raise(expr: str) -> None:
    with pytest.raises(ValueError):
        selectors(expr)


def test_parentheses_are_not_balanced_by_the_extractor() -> None:
    """Grafana and Prometheus reject such a query; the extractor only needs the names."""
    assert metric_names("sum(rate(x[5m])") == {"x"}


@pytest.mark.parametrize(
    ("query", "expr"),
    [
        ("label_values(rmqkit_consumer_received_total, queue)", "rmqkit_consumer_received_total"),
        ('label_values(up{job="a", b="c"}, instance)', 'up{job="a", b="c"}'),
        ("label_values(queue)", None),
        ("label_names()", None),
        ("metrics(rmqkit_.*)", None),
        ("query_result(topk(5, x))", "topk(5, x)"),
        ("sum(y)", "sum(y)"),
    ],
)
def test_variable_expr(query: str, expr: str | None) -> None:
    assert variable_expr(query) == expr


def test_uses_variable() -> None:
    assert uses_variable('queue="$queue"', "queue")
    assert uses_variable('queue="$queue.parking"', "queue")
    assert uses_variable('queue=~"${queue:regex}.+"', "queue")
    assert uses_variable('queue="${queue}"', "queue")
    assert uses_variable('queue="[[queue]]"', "queue")
    assert not uses_variable('queue="$queues"', "queue")
    assert not uses_variable('queue="queue"', "queue")
    assert not uses_variable('queue="$vhost"', "queue")


def test_parse_exposition() -> None:
    text = (
        "# HELP h_seconds Time.\n"
        "# TYPE h_seconds histogram\n"
        'h_seconds_bucket{queue="q",le="0.1"} 1.0\n'
        'h_seconds_sum{queue="q"} 0.05\n'
        "# TYPE empty_total counter\n"
        "# TYPE g gauge\n"
        'g{vhost="v",queue="a b}"} 3 1700000000000\n'
        "plain 1\n"
    )
    exposition = parse_exposition(text)
    assert exposition.sampled == {
        "h_seconds_bucket": {"queue", "le"},
        "h_seconds_sum": {"queue"},
        "g": {"vhost", "queue"},
        "plain": set(),
    }
    assert exposition.declared == {
        "h_seconds_bucket",
        "h_seconds_sum",
        "h_seconds_count",
        "empty_total",
        "g",
    }
