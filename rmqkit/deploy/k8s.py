"""`rmqkit deploy k8s`: a Deployment running `rmqkit consume`, scaled by KEDA on its queues.

Documents, in order: the ConfigMap holding the topology file (unless the image has it), the
Deployment, KEDA's TriggerAuthentication (the management API URL, from the Secret) and the
ScaledObject. No credentials are written: the consumer and KEDA read them from a Secret the
operator creates (docs/deploy.md).

Why each number is what it is, as the comments in the YAML say:

* ``terminationGracePeriodSeconds``: the kubelet runs the preStop hook, then sends SIGTERM, and
  kills the container when the period (counted from the hook's start) ends. On SIGTERM the
  supervisor forwards one SIGTERM to each worker, which cancels its consumers (no new
  deliveries, ``/readyz`` 503), lets in-flight handlers finish within ``--grace``, acks them and
  exits 0. So the period is the hook + the grace + a margin for the acks and the exit.
* the preStop sleep only delays SIGTERM, so that the pod has left the endpoints of any Service
  (a scraper of /metrics) before its health server goes away; the consumer keeps consuming
  during it, which is why it is short.
* KEDA counts ``messages`` (ready + unacknowledged) of the work queue, its lanes or partitions,
  and every wait queue, through the management API: a retry waiting in a wait queue comes back
  to the work queue and needs a consumer then, and a message being handled is unacked. Counted
  over AMQP a queue reports its ready messages only.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from rmqkit.deploy.command import (
    STOP_MARGIN_S,
    ConsumeCommand,
    consume_args,
    stop_timeout_s,
    stop_warnings,
)
from rmqkit.deploy.target import ConsumeTarget
from rmqkit.deploy.yamltext import Commented, Node, documents
from rmqkit.errors import DataError, UsageError

# The keys of the Secret the operator creates (the same names as the environment variables).
URL_KEY = "RMQKIT_URL"
MANAGEMENT_URL_KEY = "RMQKIT_MANAGEMENT_URL"
KEYRING_KEY = "RMQKIT_KEYRING"

# The non-root user of the Dockerfile at the repository's root: numeric, so the kubelet can
# check runAsNonRoot without reading the image's /etc/passwd.
RUN_AS = 10001
TOPOLOGY_DIR = "/etc/rmqkit/topology"
CONFIGMAP_LIMIT = 1024 * 1024  # the API server's limit on one ConfigMap
# Leaves room for "-topology", "-rabbitmq", KEDA's "keda-hpa-" and a pod's suffixes in 63.
MAX_NAME = 40
_NAME = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?")
_SUBDOMAIN = re.compile(rf"{_NAME.pattern}(?:\.{_NAME.pattern})*")  # a Secret's name
_KEY = re.compile(r"[-._a-zA-Z0-9]+")


@dataclass(frozen=True)
class K8sOptions:
    """What `rmqkit deploy k8s` takes besides the topology and the queue."""

    name: str  # of every object, a DNS label
    image: str
    secret: str  # the Secret with RMQKIT_URL and RMQKIT_MANAGEMENT_URL
    command: ConsumeCommand  # its metrics_port is the probes' port
    pre_stop_s: int = 5
    replicas_min: int = 1
    replicas_max: int = 10
    messages_per_replica: int | None = None  # None: the prefetch of the queues served
    # The topology file's text, for a ConfigMap mounted in the pod; or, None, the path of the
    # file in the image (``topology_in_image``).
    topology_text: str | None = None
    topology_in_image: str | None = None


@dataclass(frozen=True)
class Manifests:
    """The YAML documents (each with the comment above it) and what to tell the operator."""

    documents: list[tuple[dict[str, Node], str | None]]
    warnings: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        """The multi-document YAML."""
        return documents(self.documents)


def default_name(queue: str) -> str:
    """A DNS label from a queue name: ``orders.work`` → ``orders-work``."""
    name = re.sub(r"[^a-z0-9]+", "-", queue.lower()).strip("-")[:MAX_NAME].strip("-")
    if not name:
        raise UsageError(f"cannot derive a name from queue {queue!r}: give --name")
    return name


def check_name(name: str) -> str:
    """``--name`` if it is a DNS label of at most ``MAX_NAME`` characters, else a UsageError."""
    if len(name) > MAX_NAME or not _NAME.fullmatch(name):
        raise UsageError(
            f"--name {name!r}: lower-case letters, digits and '-', starting and ending with a "
            f"letter or digit, at most {MAX_NAME} characters"
        )
    return name


def check_secret(name: str) -> str:
    """``--secret`` if it is a DNS subdomain (a Secret's name), else a UsageError."""
    if len(name) > 253 or not _SUBDOMAIN.fullmatch(name):
        raise UsageError(
            f"--secret {name!r}: lower-case letters, digits, '-' and '.' (a Secret's name)"
        )
    return name


def topology_path(source: str) -> tuple[str, str]:
    """(ConfigMap key, path in the container) for the topology file ``source``."""
    key = PurePosixPath(source.replace("\\", "/")).name
    if not _KEY.fullmatch(key):
        key = "topology.toml"
    return key, f"{TOPOLOGY_DIR}/{key}"


def _secret_env(name: str, secret: str, key: str) -> dict[str, Node]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def _probe(path: str, period_s: int, failures: int) -> dict[str, Node]:
    return {
        "httpGet": {"path": path, "port": "metrics"},
        "periodSeconds": period_s,
        "timeoutSeconds": 2,
        "failureThreshold": failures,
    }


def _container(target: ConsumeTarget, options: K8sOptions, topology: str) -> dict[str, Node]:
    command = options.command
    args: list[Node] = [*consume_args(target, command, topology)]
    env: list[Node] = [
        _secret_env("RMQKIT_URL", options.secret, URL_KEY),
        Commented(
            _secret_env("RMQKIT_MANAGEMENT_URL", options.secret, MANAGEMENT_URL_KEY),
            "consume checks the queues' dead-letter wiring through it at start",
        ),
    ]
    if target.needs_keyring:
        env.append(
            Commented(
                _secret_env("RMQKIT_KEYRING", options.secret, KEYRING_KEY),
                "encrypt = true: consume refuses to start without the key ring (the JSON of "
                "`rmqkit keys generate`)",
            )
        )
    mounts: list[Node] = [{"name": "tmp", "mountPath": "/tmp"}]
    if options.topology_text is not None:
        mounts.insert(0, {"name": "topology", "mountPath": TOPOLOGY_DIR, "readOnly": True})
    lifecycle: Node = {}
    if options.pre_stop_s:
        lifecycle = Commented(
            {"preStop": {"exec": {"command": ["sleep", str(options.pre_stop_s)]}}},
            "Delays SIGTERM so the pod leaves the Services' endpoints first (a /metrics "
            "scraper); the\nconsumer still consumes meanwhile. SIGTERM starts the graceful "
            "stop: consumers cancelled,\nin-flight handlers finished within --grace and acked, "
            "exit 0.",
        )
    container: dict[str, Node] = {
        "name": "consumer",
        "image": options.image,
        "command": ["rmqkit"],
        "args": args,
        "env": env,
        "ports": [{"name": "metrics", "containerPort": command.metrics_port, "protocol": "TCP"}],
        "startupProbe": Commented(
            _probe("/healthz", 2, 30),
            "the health server listens once consume has loaded the handler and checked the "
            "queues: up to 60s",
        ),
        "livenessProbe": Commented(
            _probe("/healthz", 10, 3),
            "/healthz: the consumer's event loop is running (a restart helps only if it is stuck)",
        ),
        "readinessProbe": Commented(
            _probe("/readyz", 5, 2),
            "/readyz: every served queue connected and consuming; a rolling update waits for it",
        ),
    }
    if lifecycle:
        container["lifecycle"] = lifecycle
    container["securityContext"] = {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    container["volumeMounts"] = Commented(
        mounts, "/tmp is the only writable path (an emptyDir): the root filesystem is read-only"
    )
    return container


def _deployment(target: ConsumeTarget, options: K8sOptions, topology: str) -> dict[str, Node]:
    labels: dict[str, Node] = {
        "app.kubernetes.io/name": options.name,
        "app.kubernetes.io/component": "consumer",
    }
    grace = stop_timeout_s(options.command, options.pre_stop_s)
    annotations: dict[str, Node] = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(options.command.metrics_port),
        "prometheus.io/path": "/metrics",
    }
    volumes: list[Node] = [{"name": "tmp", "emptyDir": {}}]
    if options.topology_text is not None:
        digest = hashlib.sha256(options.topology_text.encode("utf-8")).hexdigest()
        annotations = {
            "rmqkit/topology-sha256": Commented(
                digest, "a changed topology file changes the pod template: the pods roll"
            ),
            **annotations,
        }
        volumes.insert(0, {"name": "topology", "configMap": {"name": f"{options.name}-topology"}})
    pod: dict[str, Node] = {
        "terminationGracePeriodSeconds": Commented(
            grace,
            f"preStop {options.pre_stop_s}s + --grace {options.command.grace_s:g}s (in-flight "
            f"handlers finish and are acked) + {STOP_MARGIN_S}s\nfor the last acks, the "
            "connection's close and the processes' exit; SIGKILL only after that\n(what was "
            "still unacked is then redelivered, never lost)",
        ),
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS,
            "runAsGroup": RUN_AS,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [_container(target, options, topology)],
        "volumes": volumes,
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": options.name,
            "labels": labels,
            "annotations": {"rmqkit/queue": target.queue, "rmqkit/topology": target.source},
        },
        "spec": Commented(
            {
                "selector": {"matchLabels": {"app.kubernetes.io/name": options.name}},
                "strategy": Commented(
                    {
                        "type": "RollingUpdate",
                        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
                    },
                    "a new pod consumes (ready) before an old one is stopped",
                ),
                "template": {
                    "metadata": {"labels": labels, "annotations": annotations},
                    "spec": pod,
                },
            },
            "no replicas: the ScaledObject below owns the count (an apply would reset it)",
        ),
    }


def _configmap(options: K8sOptions, key: str) -> dict[str, Node]:
    assert options.topology_text is not None
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": f"{options.name}-topology",
            "labels": {"app.kubernetes.io/name": options.name},
        },
        "data": {key: options.topology_text},
    }


def _trigger_authentication(options: K8sOptions) -> dict[str, Node]:
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "TriggerAuthentication",
        "metadata": {
            "name": f"{options.name}-rabbitmq",
            "labels": {"app.kubernetes.io/name": options.name},
        },
        "spec": {
            "secretTargetRef": [
                Commented(
                    {"parameter": "host", "name": options.secret, "key": MANAGEMENT_URL_KEY},
                    "the management API URL with its credentials, ending in '/' (the vhost is "
                    "vhostName below)",
                )
            ]
        },
    }


def _scaled_object(target: ConsumeTarget, options: K8sOptions) -> dict[str, Node]:
    per_replica = options.messages_per_replica or target.prefetch
    served = ", ".join(target.served)
    metadata: dict[str, Node] = {
        "protocol": "http",
        "mode": "QueueLength",
        "value": Commented(
            str(per_replica),
            "messages per replica (one replica holds at most its prefetch, "
            f"{target.prefetch}, unacked)",
        ),
        "activationValue": Commented(
            "0", "any message ready, in hand or waiting for its retry keeps a replica"
        ),
        "queueName": Commented(
            target.counted_pattern,
            f"{served} and all {'their' if len(target.served) > 1 else 'its'} wait queues "
            "(any tier: a tier dropped from the file still\nsends its retries back); not the "
            "parking queue. Case-sensitive, whole names.",
        ),
        "useRegex": "true",
        "operation": "sum",
        "excludeUnacknowledged": Commented(
            "false", "messages being handled are unacked: they count, so a busy replica stays"
        ),
        "pageSize": Commented(
            str(target.page_size),
            "all matching queues must fit in one page of the management API",
        ),
        "vhostName": target.vhost,
    }
    minimum = (
        "1: a consumer is always there, so a message arriving (also through the delay ladder, "
        "which is\nnot counted here) is taken at once, not after KEDA's next poll and a pod's "
        "start"
        if options.replicas_min
        else "0: scaled to zero when nothing is ready, unacked or waiting for a retry in the "
        "queues counted;\nthe first message then waits for KEDA's next poll and a pod's start"
    )
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": options.name, "labels": {"app.kubernetes.io/name": options.name}},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": options.name},
            "minReplicaCount": Commented(options.replicas_min, minimum),
            "maxReplicaCount": options.replicas_max,
            "pollingInterval": 30,
            "cooldownPeriod": Commented(
                300, "with minReplicaCount 0: seconds with nothing counted before scaling to zero"
            ),
            "triggers": [
                Commented(
                    {
                        "type": "rabbitmq",
                        "metadata": metadata,
                        "authenticationRef": {"name": f"{options.name}-rabbitmq"},
                    },
                    "HTTP (management API) mode: counts ready + unacked; AMQP mode counts "
                    "only ready messages",
                )
            ],
        },
    }


def k8s_manifests(target: ConsumeTarget, options: K8sOptions) -> Manifests:
    """The documents `rmqkit deploy k8s` prints. UsageError (64) for options that cannot
    work (names, replica counts, no health port); DataError (65) for a topology file too
    large for a ConfigMap."""
    check_name(options.name)
    check_secret(options.secret)
    if options.command.metrics_port is None:
        raise UsageError("--metrics-port: the probes need the health server")
    if not 0 <= options.replicas_min <= options.replicas_max or options.replicas_max < 1:
        raise UsageError(
            f"--replicas-min {options.replicas_min} / --replicas-max {options.replicas_max}: "
            "need 0 <= min <= max and max >= 1"
        )
    if not options.image.strip() or any(c.isspace() for c in options.image):
        raise UsageError(f"--image {options.image!r}: an image reference has no spaces")
    warnings = stop_warnings(target, options.command)
    active = target.active_consumers
    if active is not None and options.replicas_max > active:
        warnings.append(
            f"{', '.join(target.served)}: one active consumer per queue, so replicas past "
            f"{active} only wait as standbys (--replicas-max {active} or fewer)"
        )
    docs: list[tuple[dict[str, Node], str | None]] = []
    header: str | None = (
        f"rmqkit deploy k8s: `rmqkit consume` of queue {target.queue} in vhost {target.vhost}, "
        f"from {target.source}.\nBefore applying, create the Secret {options.secret} with the "
        f"keys {URL_KEY} (amqp://user:password@host:5672/vhost)\nand {MANAGEMENT_URL_KEY} "
        "(http://user:password@host:15672/)"
        + (f" and {KEYRING_KEY}" if target.needs_keyring else "")
        + "; KEDA must be installed (docs/deploy.md)."
    )
    if (options.topology_text is None) == (options.topology_in_image is None):
        raise UsageError("give the topology file's text (a ConfigMap) or its path in the image")
    if options.topology_text is not None:
        if len(options.topology_text.encode("utf-8")) > CONFIGMAP_LIMIT:
            raise DataError(
                f"{target.source} is larger than a ConfigMap holds (1 MiB): put it in the image "
                "and give --topology-path"
            )
        key, path = topology_path(target.source)
        docs.append((_configmap(options, key), header))
        header = None
    else:
        assert options.topology_in_image is not None
        path = options.topology_in_image
    docs.append((_deployment(target, options, path), header))
    docs.append((_trigger_authentication(options), None))
    docs.append((_scaled_object(target, options), None))
    return Manifests(docs, warnings)
