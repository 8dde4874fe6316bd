"""`rmqkit deploy k8s | systemd` and the Dockerfile (docs/deploy.md), without a cluster.

- every Kubernetes document validates against the Kubernetes JSON schemas
  (kubernetes-validate, strict: an unknown field fails), the KEDA ones against the
  openAPIV3Schema of KEDA's CRDs (tests/data/keda, made strict the same way);
- the consumer's command line in the Deployment and the unit parses as `rmqkit consume`'s own
  options (the real click command), and names the vhost KEDA counts in;
- KEDA's queue pattern matches exactly the served queues and their wait queues of the declared
  topology, never a parking queue or another work queue;
- no credential reaches any output, the termination grace and stop timeout exceed the grace;
- the unit passes `systemd-analyze verify` with no warning (and its offline security check);
- the Dockerfile's instructions: the base, a numeric non-root user, rmqkit as entry point, no
  secrets. The image was not built here (no Docker engine).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import typer
import yaml
from hypothesis import given
from hypothesis import strategies as st

from rmqkit.cli.main import app, main
from rmqkit.consumer.config import DEFAULT_HANDLER_TIMEOUT_S
from rmqkit.deploy.command import CONSUME_HANDLER_TIMEOUT_S, STOP_MARGIN_S
from rmqkit.deploy.k8s import RUN_AS
from rmqkit.deploy.target import CASE_SENSITIVE
from rmqkit.deploy.yamltext import Commented, document, documents, plain_data
from rmqkit.errors import ExitCode
from rmqkit.topology import parse_topology
from rmqkit.topology.expand import expand

ROOT = Path(__file__).resolve().parents[2]
KEDA = ROOT / "tests" / "data" / "keda"
RMQKIT = Path(sys.executable).parent / "rmqkit"  # the console script of this environment
PASSWORD = "s3cr3t-Pw"  # in the environment the commands run with: never in their output
URL = f"amqp://deployer:{PASSWORD}@mq.internal:5672/orders"
K8S_VERSIONS = ("1.25", "1.30", kubernetes_validate.utils.latest_version())

ORDERS = """\
[exchanges.orders]
type = "topic"

[queues."orders.work"]
bind = [{ exchange = "orders", routing_key = "order.*" }]
retry_delays = ["1s", "5s", "30s"]
prefetch = 100
handler_timeout = "20s"

[queues."orders.work.audit"]
retry_delays = ["7s"]

[queues."Orders.Work"]
retry_delays = ["1s"]

[queues."payments.work"]
encrypt = true
sensitive_fields = ["card"]
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory with the topology files, as the working directory (no .env), and a
    broker URL with a password in the environment."""
    (tmp_path / "orders.toml").write_text(ORDERS)
    shutil.copy(ROOT / "topologies" / "flow.toml", tmp_path / "flow.toml")
    monkeypatch.chdir(tmp_path)
    for name in [n for n in os.environ if n.startswith("RMQKIT_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("RMQKIT_URL", URL)
    monkeypatch.setenv("RMQKIT_MANAGEMENT_URL", f"http://deployer:{PASSWORD}@mq.internal:15672/")
    return tmp_path


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    assert PASSWORD not in out + err
    return code, out, err


K8S = ["deploy", "k8s", "orders.toml", "--queue", "orders.work", "--handler", "app.jobs:handle"]
K8S += ["--image", "registry.example/orders:1.4"]


def k8s_docs(capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, dict[str, Any]]:
    code, out, err = run(capsys, *K8S, *extra)
    assert code == 0, err
    docs = list(yaml.safe_load_all(out))
    assert all(isinstance(d, dict) for d in docs), out  # nothing but YAML documents on stdout
    return {d["kind"]: d for d in docs}


def container(docs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    (only,) = docs["Deployment"]["spec"]["template"]["spec"]["containers"]
    return only


# --- the consumer's command line --------------------------------------------------------------


def parsed_consume(args: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``args`` (after ``rmqkit``: global options, ``consume``, its own) parsed by the real
    CLI without running anything: the root's parameters and consume's."""
    at = args.index("consume")
    root = typer.main.get_command(app)
    context = root.make_context("rmqkit", [*args[:at], "consume"])
    command = root.get_command(context, "consume")
    return context.params, command.make_context("consume", args[at + 1 :], parent=context).params


def test_the_deployment_runs_consume_with_the_health_server(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = k8s_docs(capsys, "--grace", "45s", "--metrics-port", "9300")
    consumer = container(docs)
    assert consumer["command"] == ["rmqkit"]
    root, options = parsed_consume(consumer["args"])
    assert root["vhost"] == "orders"  # the URL's vhost, named explicitly
    assert options["handler"] == "app.jobs:handle"
    assert options["queue"] == "orders.work"
    assert options["grace"] == "45s"
    assert options["metrics_port"] == 9300
    assert options["topology"] == Path("/etc/rmqkit/topology/orders.toml")
    assert consumer["ports"] == [{"name": "metrics", "containerPort": 9300, "protocol": "TCP"}]
    assert consumer["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert consumer["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert consumer["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 5 + 45 + STOP_MARGIN_S
    assert consumer["lifecycle"] == {"preStop": {"exec": {"command": ["sleep", "5"]}}}
    assert "replicas" not in docs["Deployment"]["spec"]  # KEDA owns it


def test_without_a_prestop_hook_the_grace_period_is_grace_and_margin(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = k8s_docs(capsys, "--pre-stop", "0s", "--grace", "2m")
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 120 + STOP_MARGIN_S
    assert "lifecycle" not in container(docs)
    assert container(docs)["args"][container(docs)["args"].index("--grace") + 1] == "2m"


def test_credentials_come_from_the_secret_only(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = k8s_docs(capsys, "--secret", "mq-credentials.v2")
    env = container(docs)["env"]
    assert all("value" not in entry for entry in env)
    assert {e["name"]: e["valueFrom"]["secretKeyRef"] for e in env} == {
        "RMQKIT_URL": {"name": "mq-credentials.v2", "key": "RMQKIT_URL"},
        "RMQKIT_MANAGEMENT_URL": {"name": "mq-credentials.v2", "key": "RMQKIT_MANAGEMENT_URL"},
    }
    auth = docs["TriggerAuthentication"]
    assert auth["spec"] == {
        "secretTargetRef": [
            {"parameter": "host", "name": "mq-credentials.v2", "key": "RMQKIT_MANAGEMENT_URL"}
        ]
    }
    trigger = docs["ScaledObject"]["spec"]["triggers"][0]
    assert trigger["authenticationRef"] == {"name": auth["metadata"]["name"]}
    assert not {"host", "username", "password"} & set(trigger["metadata"])
    assert "Secret" not in docs  # the operator creates it; rmqkit never writes one


def test_an_encrypting_queue_gets_its_key_ring_from_the_secret(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = k8s_docs(capsys, "--queue", "payments.work", "--name", "payments")
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container(docs)["env"]}
    assert refs["RMQKIT_KEYRING"] == {"name": "payments-rabbitmq", "key": "RMQKIT_KEYRING"}


def test_the_scaled_object_counts_ready_unacked_and_waiting_messages(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = k8s_docs(capsys, "--replicas-max", "7")
    spec = docs["ScaledObject"]["spec"]
    assert spec["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": docs["Deployment"]["metadata"]["name"],
    }
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (1, 7)
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "rabbitmq"
    meta = trigger["metadata"]
    assert {k: meta[k] for k in ("protocol", "mode", "useRegex", "operation")} == {
        "protocol": "http",
        "mode": "QueueLength",
        "useRegex": "true",
        "operation": "sum",
    }
    assert meta["excludeUnacknowledged"] == "false"
    assert meta["activationValue"] == "0"
    assert meta["value"] == "100"  # the queue's prefetch: one replica's window
    assert meta["vhostName"] == "orders"
    assert meta["queueName"].startswith(CASE_SENSITIVE + "^") and meta["queueName"].endswith("$")


def test_the_vhost_follows_the_global_option(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = k8s_docs(capsys, "--vhost", "orders/eu", "--replicas-min", "0")
    assert docs["ScaledObject"]["spec"]["triggers"][0]["metadata"]["vhostName"] == "orders/eu"
    assert container(docs)["args"][:2] == ["--vhost", "orders/eu"]
    assert docs["ScaledObject"]["spec"]["minReplicaCount"] == 0


def counted(pattern: str) -> re.Pattern[str]:
    """KEDA's pattern as the broker applies it (PCRE, its caseless default undone)."""
    assert pattern.startswith(CASE_SENSITIVE)
    return re.compile(pattern.removeprefix(CASE_SENSITIVE))


def declared_queues(path: Path) -> list[tuple[str, str, str]]:
    """(name, role, owner) of every queue `rmqkit declare` creates for the file."""
    state = expand(parse_topology(path.read_text(), str(path)))
    return [(q.name, q.role, q.owner) for q in state.queues]


@pytest.mark.parametrize(
    ("file", "queue", "served"),
    [
        ("orders.toml", "orders.work", {"orders.work"}),
        (
            "flow.toml",
            "media.work",
            {"media.work", "media.work.lane.large", "media.work.lane.bulk"},
        ),
        ("flow.toml", "media.work.lane.bulk", {"media.work.lane.bulk"}),
        ("flow.toml", "accounts.work", {f"accounts.work.p{i}" for i in range(4)}),
        ("flow.toml", "accounts.work.p2", {"accounts.work.p2"}),
        ("flow.toml", "ledger.work", {"ledger.work"}),
    ],
)
def test_the_pattern_matches_the_served_queues_and_their_wait_queues_only(
    project: Path, capsys: pytest.CaptureFixture[str], file: str, queue: str, served: set[str]
) -> None:
    code, out, err = run(
        capsys, "deploy", "k8s", file, "-q", queue, "--handler", "a:b", "--image", "i"
    )
    assert code == 0, err
    scaled = next(d for d in yaml.safe_load_all(out) if d["kind"] == "ScaledObject")
    meta = scaled["spec"]["triggers"][0]["metadata"]
    pattern = counted(meta["queueName"])
    queues = declared_queues(project / file)
    expected = {n for n, role, owner in queues if owner in served and role in ("work", "wait")}
    assert {n for n, _, _ in queues if pattern.search(n)} == expected
    assert expected >= served and len(expected) > len(served)  # the wait queues are in it
    assert int(meta["pageSize"]) >= len(expected)
    for name in sorted(served):  # a tier the file no longer names still counts; nothing else
        assert pattern.search(f"{name}.wait.9s") and pattern.search(f"{name}.wait.9s.slot-5s")
        assert not pattern.search(f"{name}.parking") and not pattern.search(f"x{name}")
        assert not pattern.search(f"{name}.wait.9s.parking") and not pattern.search(f"{name}x")
        assert not pattern.search(name.upper())


def test_a_work_queue_named_like_another_ones_wait_queue_is_refused(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (project / "clash.toml").write_text(
        '[queues."a.work"]\nretry_delays = ["1s"]\n[queues."a.work.wait.3s"]\n'
    )
    code, out, err = run(
        capsys, "deploy", "k8s", "clash.toml", "-q", "a.work", "--handler", "a:b", "--image", "i"
    )
    assert code == ExitCode.DATA and out == ""
    assert "'a.work.wait.3s' is named like a wait queue of 'a.work'" in err


def test_an_unknown_queue_is_one_line_naming_the_work_queues(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for target in ("k8s", "systemd"):
        extra = ["--image", "i"] if target == "k8s" else []
        code, out, err = run(
            capsys, "deploy", target, "flow.toml", "-q", "media.wrk", "--handler", "a:b", *extra
        )
        assert code == ExitCode.USAGE and out == ""
        assert err == (
            "rmqkit: error: flow.toml has no work queue 'media.wrk' (work queues in it: "
            "media.work, media.work.lane.large, media.work.lane.bulk, accounts.work, "
            "accounts.work.p0, accounts.work.p1, accounts.work.p2, accounts.work.p3, "
            "ledger.work) — name one of them with --queue\n"
        )


def test_the_topology_configmap_holds_the_file_and_rolls_the_pods(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = k8s_docs(capsys)
    assert docs["ConfigMap"]["data"] == {"orders.toml": ORDERS}
    pod = docs["Deployment"]["spec"]["template"]
    digest = hashlib.sha256(ORDERS.encode()).hexdigest()
    assert pod["metadata"]["annotations"]["rmqkit/topology-sha256"] == digest
    volume = {"name": "topology", "configMap": {"name": docs["ConfigMap"]["metadata"]["name"]}}
    assert volume in pod["spec"]["volumes"]
    mount = {"name": "topology", "mountPath": "/etc/rmqkit/topology", "readOnly": True}
    assert mount in container(docs)["volumeMounts"]


def test_a_topology_in_the_image_needs_no_configmap(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = k8s_docs(capsys, "--topology-path", "/app/topologies/orders.toml")
    assert "ConfigMap" not in docs
    args = container(docs)["args"]
    assert args[args.index("--topology") + 1] == "/app/topologies/orders.toml"
    assert [v["name"] for v in docs["Deployment"]["spec"]["template"]["spec"]["volumes"]] == ["tmp"]


def test_the_pod_runs_as_the_dockerfiles_user_without_privileges(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = k8s_docs(capsys)
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == RUN_AS == dockerfile_uid()
    assert container(docs)["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


# --- validation against the schemas -----------------------------------------------------------


def strict(schema: Any) -> Any:
    """A CRD's openAPIV3Schema as the API server applies it with strict field validation
    (kubectl's default): an object schema that lists its properties takes no others."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def keda_schema(kind: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((KEDA / f"{kind.lower()}-v1alpha1.json").read_text())
    return strict(loaded)


def test_the_keda_schemas_are_stored() -> None:
    for kind in ("ScaledObject", "TriggerAuthentication"):
        schema = keda_schema(kind)
        jsonschema.Draft202012Validator.check_schema(schema)
        assert "spec" in schema["properties"]
    assert "v2.20.2" in (KEDA / "README.md").read_text()


PARTITIONED = ["--handler", "a:b", "--image", "i", "--replicas-max", "4"]


def k8s_variants(capsys: pytest.CaptureFixture[str]) -> Iterator[dict[str, Any]]:
    """The documents of several runs: defaults, lanes, partitions, the key ring, no hook,
    scale to zero, a topology in the image."""
    runs = [
        K8S,
        [*K8S, "--queue", "payments.work", "--name", "payments", "--pre-stop", "0s"],
        [*K8S, "--replicas-min", "0", "--topology-path", "/app/t.toml", "--arg=--prefetch=20"],
        ["deploy", "k8s", "flow.toml", "-q", "media.work", "--handler", "m", "--image", "i"],
        ["deploy", "k8s", "-t", "flow.toml", "-q", "accounts.work", *PARTITIONED],
    ]
    for args in runs:
        code, out, err = run(capsys, *args)
        assert code == 0, (args, err)
        yield from yaml.safe_load_all(out)


def test_every_document_validates_strictly(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kinds: set[str] = set()
    for doc in k8s_variants(capsys):
        kinds.add(doc["kind"])
        if doc["apiVersion"].startswith("keda.sh/"):
            jsonschema.validate(doc, keda_schema(doc["kind"]))
            assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"])
        else:
            for version in K8S_VERSIONS:
                kubernetes_validate.validate(doc, version, strict=True)
    assert kinds == {"ConfigMap", "Deployment", "ScaledObject", "TriggerAuthentication"}


def test_the_validators_reject_an_unknown_field(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The checks above can fail: a misspelt field is refused by each of them."""
    docs = k8s_docs(capsys)
    scaled = copy.deepcopy(docs["ScaledObject"])
    scaled["spec"]["minReplicas"] = 1
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(scaled, keda_schema("ScaledObject"))
    auth = copy.deepcopy(docs["TriggerAuthentication"])
    auth["spec"]["secretTargetRef"][0]["secret"] = "x"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(auth, keda_schema("TriggerAuthentication"))
    deployment = copy.deepcopy(docs["Deployment"])
    deployment["spec"]["template"]["spec"]["terminationGracePeriod"] = 5
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSIONS[-1], strict=True)


def documented_commands() -> list[list[str]]:
    """The `rmqkit deploy` command lines of docs/deploy.md's shell blocks, up to a pipe or a
    redirection."""
    text = (ROOT / "docs" / "deploy.md").read_text()
    found = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            if line.startswith("rmqkit deploy "):
                words = shlex.split(line)
                cut = [i for i, w in enumerate(words) if w in ("|", ">")]
                found.append(words[1 : cut[0] if cut else None])
    return found


def test_the_documented_commands_print_what_the_tests_check(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)  # the repository's topologies/, as the page's commands name them
    for name in [n for n in os.environ if n.startswith("RMQKIT_")]:
        monkeypatch.delenv(name)
    commands = documented_commands()
    assert sorted(c[:2] for c in commands) == [["deploy", "k8s"], ["deploy", "systemd"]]
    for args in commands:
        code, out, err = run(capsys, *args)
        assert (code, err) == (0, ""), (args, err)
        if args[1] == "k8s":
            for doc in yaml.safe_load_all(out):
                if doc["apiVersion"].startswith("keda.sh/"):
                    jsonschema.validate(doc, keda_schema(doc["kind"]))
                else:
                    kubernetes_validate.validate(doc, K8S_VERSIONS[-1], strict=True)
        else:
            assert settings_of(out)["KillMode"] == ["mixed"]


# --- warnings and refusals --------------------------------------------------------------------


def test_a_grace_below_the_handler_timeout_is_warned_about(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, *K8S, "--grace", "10s")
    assert code == 0 and list(yaml.safe_load_all(out))
    assert err.startswith("warning: --grace 10s is shorter than the handler timeout (20s)")
    code, out, err = run(capsys, *K8S, "--grace", "10s", "--arg=--handler-timeout=5s")
    assert code == 0 and err == ""
    assert CONSUME_HANDLER_TIMEOUT_S == DEFAULT_HANDLER_TIMEOUT_S


def test_single_active_consumer_queues_warn_about_idle_replicas(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["deploy", "k8s", "flow.toml", "--handler", "a:b", "--image", "i"]
    code, _, err = run(capsys, *base, "-q", "accounts.work", "--replicas-max", "6")
    assert code == 0
    assert "replicas past 4 only wait as standbys" in err
    code, _, err = run(capsys, *base, "-q", "accounts.work", "--replicas-max", "4")
    assert code == 0 and err == ""


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--arg=--queue=x"], "the deployment sets --queue itself"),
        (["--arg", "-qx"], "the deployment sets -q itself"),
        (["--arg=--dedupe=postgresql://app:hunter2@db/app"], "a URL with a password is refused"),
        (["--name", "Orders_Work"], "--name 'Orders_Work': lower-case letters"),
        (["--grace", "30 parsecs"], "--grace: bad duration"),
        (["--handler", "app.jobs:"], "give module:function"),
        (["--replicas-min", "3", "--replicas-max", "2"], "need 0 <= min <= max"),
        (["--image", "a b"], "an image reference has no spaces"),
        (["--secret", "MQ"], "--secret 'MQ': lower-case letters, digits, '-' and '.'"),
    ],
)
def test_bad_options_are_usage_errors(
    project: Path, capsys: pytest.CaptureFixture[str], extra: list[str], says: str
) -> None:
    code, out, err = run(capsys, *K8S, *extra)
    assert code == ExitCode.USAGE and out == ""
    assert len(err.splitlines()) == 1 and says in err, err
    assert "hunter2" not in err


def test_a_missing_topology_file_is_the_usual_error(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "deploy", "k8s", "nope.toml", *K8S[3:])
    assert (code, out, err) == (ExitCode.DATA, "", "rmqkit: error: nope.toml: no such file\n")
    code, out, err = run(capsys, "deploy", "k8s", *K8S[3:])
    assert code == ExitCode.USAGE and "no topology file" in err


# --- the YAML writer --------------------------------------------------------------------------

TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)
LINES = st.lists(
    st.sampled_from(["", " ", "  x", "a", "# c", "\tt", "k: v", "- i", "x  ", "---", "'q'"]),
    max_size=6,
).map("\n".join)
SCALARS = st.one_of(TEXT, LINES, st.integers(-(2**40), 2**40), st.booleans(), st.none())
DATA = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(TEXT | LINES, inner, max_size=4)
    ),
    max_leaves=20,
)


@given(st.dictionaries(TEXT, DATA, max_size=5), TEXT)
def test_the_yaml_reads_back_as_the_data(data: dict[str, Any], comment: str) -> None:
    text = document(data, comment)
    assert yaml.safe_load(text) == data


@pytest.mark.parametrize(
    "value",
    [
        "yes",
        "No",
        "on",
        "10001",
        "0x1F",
        "1_000",
        "1:20",
        "2026-01-01",
        "null",
        "~",
        "",
        "@x",
        "a: b",
        "x #y",
        "-",
        "- a",
        "\x85",
        "\u2028",
        "\ufeff",
        "tab\there",
        " lead",
        "trail ",
        "a\nb",
        "\n lead\n",
        "a\r\nb",
        "x\n\n\n",
        "\\",
        '"',
        "'",
        "%x",
        "{a}",
        "[a]",
        "*a",
        "!t",
    ],
)
def test_strings_yaml_would_misread_are_quoted(value: str) -> None:
    text = document({"k": value, value: Commented([value, {value: value}], f"c {value}")})
    assert yaml.safe_load(text) == {"k": value, value: [value, {value: value}]}


def test_comments_and_documents() -> None:
    docs = [
        ({"a": Commented({"b": 1}, "one\ntwo")}, "head\nline"),
        ({"c": [Commented(2, "n")]}, None),
    ]
    text = documents(docs)
    assert list(yaml.safe_load_all(text)) == [plain_data(d) for d, _ in docs]
    assert text.startswith("---\n# head\n# line\n")
    assert "  # n\n  - 2\n" in text


# --- systemd ----------------------------------------------------------------------------------

SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_systemd_analyze = pytest.mark.skipif(
    SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed"
)


def unit_text(
    capsys: pytest.CaptureFixture[str], project: Path, *extra: str, queue: str = "orders.work"
) -> str:
    code, out, err = run(
        capsys,
        "deploy",
        "systemd",
        "orders.toml",
        "--queue",
        queue,
        "--handler",
        "app.jobs:handle",
        "--exec",
        str(RMQKIT),
        "--working-directory",
        str(project),
        *extra,
    )
    assert code == 0, err
    return out


def verify(path: Path) -> subprocess.CompletedProcess[str]:
    assert SYSTEMD_ANALYZE is not None
    return subprocess.run(
        [SYSTEMD_ANALYZE, "verify", "--man=no", str(path)],
        capture_output=True,
        text=True,
        check=False,
        cwd=path.parent,
    )


def settings_of(text: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line and not line.startswith(("#", "[")) and "=" in line:
            key, value = line.split("=", 1)
            found.setdefault(key, []).append(value)
    return found


@needs_systemd_analyze
@pytest.mark.parametrize(
    "extra",
    [[], ["--user", "orders", "--state-directory", "--metrics-port", "9100", "--grace", "90s"]],
)
def test_the_unit_passes_systemd_analyze_verify(
    project: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path, extra: list[str]
) -> None:
    path = tmp_path / "rmqkit-orders-work.service"
    path.write_text(unit_text(capsys, project, *extra))
    done = verify(path)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    security = subprocess.run(
        [str(SYSTEMD_ANALYZE), "security", "--offline=yes", "--threshold=30", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert security.returncode == 0, security.stdout[-400:]  # exposure 3.0 ("OK") at most


@needs_systemd_analyze
def test_verify_fails_on_a_missing_executable(
    project: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The check above can fail: verify needs ExecStart's program to exist."""
    path = tmp_path / "x.service"
    path.write_text(unit_text(capsys, project, "--exec", "/nonexistent/rmqkit"))
    done = verify(path)
    assert done.returncode != 0 and "/nonexistent/rmqkit" in done.stderr


@needs_systemd_analyze
def test_odd_paths_and_names_are_escaped(
    project: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A space and a '%' in the executable's path, quotes and '$' in the queue: verify finds
    the program (so ExecStart's quoting and '%%' read back as the path), the queue's name is
    one argument."""
    odd = tmp_path / "bin dir %i"
    odd.mkdir()
    (odd / "rmqkit").symlink_to(RMQKIT)
    queue = 'odd "q" $HOME %n'
    (project / "orders.toml").write_text(ORDERS + f"\n[queues.{json.dumps(queue)}]\n")
    text = unit_text(capsys, project, "--exec", str(odd / "rmqkit"), queue=queue)
    path = tmp_path / "odd.service"
    path.write_text(text)
    done = verify(path)
    assert (done.returncode, done.stderr) == (0, "")
    exec_start = settings_of(text)["ExecStart"][0]
    words = [w.replace("%%", "%").replace("$$", "$") for w in shlex.split(exec_start)]
    assert words[0] == str(odd / "rmqkit")
    assert words[words.index("--queue") + 1] == queue


def test_the_unit_stops_gracefully_and_restarts_on_failure(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = unit_text(capsys, project, "--grace", "40s", "--env-file", "/etc/rmqkit/o.env")
    found = settings_of(text)
    assert found["KillSignal"] == ["SIGTERM"] and found["KillMode"] == ["mixed"]
    assert found["TimeoutStopSec"] == [str(40 + STOP_MARGIN_S)]
    assert found["Restart"] == ["on-failure"]
    codes = {ExitCode.USAGE, ExitCode.DATA, ExitCode.ACCESS, ExitCode.CONFIG}
    assert set(map(int, found["RestartPreventExitStatus"][0].split())) == codes
    assert found["EnvironmentFile"] == ["/etc/rmqkit/o.env"]
    assert "Environment" not in found and found["DynamicUser"] == ["yes"]
    assert found["WorkingDirectory"] == [str(project)]
    for key in ("NoNewPrivileges", "ProtectSystem", "PrivateTmp"):
        assert key in found
    root, options = parsed_consume(shlex.split(found["ExecStart"][0])[1:])
    assert options["queue"] == "orders.work" and options["grace"] == "40s"
    assert options["topology"] == project / "orders.toml"
    assert root["vhost"] == "orders"
    assert options["metrics_port"] is None  # no health server unless asked for


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--exec", "bin/rmqkit"], "--exec 'bin/rmqkit': systemd needs an absolute path"),
        (["--env-file", "/etc/x.env\\"], "no control characters, surrounding spaces or trailing"),
        (["--user", "a b"], "--user 'a b': a user name or a numeric uid"),
        (["--name", "a/b"], "--name 'a/b': letters, digits"),
        (["--arg=--topology=/x.toml"], "the deployment sets --topology itself"),
    ],
)
def test_values_systemd_cannot_take_are_usage_errors(
    project: Path, capsys: pytest.CaptureFixture[str], extra: list[str], says: str
) -> None:
    args = ["deploy", "systemd", "orders.toml", "-q", "orders.work", "--handler", "a:b"]
    code, out, err = run(capsys, *args, "--exec", "/bin/true", *extra)
    assert code == ExitCode.USAGE and out == ""
    assert len(err.splitlines()) == 1 and says in err, err


def test_a_state_directory_is_the_only_writable_path(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    found = settings_of(unit_text(capsys, project, "--state-directory", "--user", "svc"))
    assert found["StateDirectory"] == ["rmqkit/rmqkit-orders-work"]
    assert found["User"] == ["svc"] and "DynamicUser" not in found
    assert found["ProtectSystem"] == ["strict"]


# --- the Dockerfile ---------------------------------------------------------------------------


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuations joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        word, _, rest = pending.strip().partition(" ")
        instructions.append((word.upper(), " ".join(rest.split())))
        pending = ""
    assert not pending
    return instructions


def dockerfile_uid() -> int:
    users = [args for word, args in dockerfile() if word == "USER"]
    return int(users[-1].split(":")[0])


def test_the_dockerfile_runs_rmqkit_as_a_non_root_user() -> None:
    steps = dockerfile()
    words = [word for word, _ in steps]
    assert steps[0] == ("FROM", "python:3.11-slim")
    assert words.count("FROM") == 1
    assert 0 < dockerfile_uid() == RUN_AS
    assert words.index("USER") > max(i for i, w in enumerate(words) if w in ("RUN", "COPY"))
    assert ("ENTRYPOINT", '["rmqkit"]') in steps  # exec form: rmqkit is PID 1 and gets SIGTERM
    assert ("STOPSIGNAL", "SIGTERM") in steps
    installs = [args for word, args in steps if word == "RUN" and "pip install" in args]
    assert len(installs) == 1 and 'pip install ".' in installs[0]
    workdirs = [args for word, args in steps if word == "WORKDIR"]
    assert workdirs[-1] == "/app"  # consume imports the handler from here
    for word, args in steps:
        if word == "COPY":
            *sources, _ = args.split()
            assert all((ROOT / s).exists() for s in sources), args
            assert not any(s in (".", ".env") or "secret" in s.lower() for s in sources), args


def test_the_dockerfile_holds_no_secrets() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert not re.search(r"://[^/\s:@]+:[^/\s@]+@", text)  # no URL with a password
    for word, args in dockerfile():
        if word in ("ENV", "ARG", "LABEL"):
            names = re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=", args) or [args.split()[0]]
            for name in names:
                assert not re.search(r"PASS|SECRET|TOKEN|KEY|RMQKIT_URL|CREDENTIAL", name), name
