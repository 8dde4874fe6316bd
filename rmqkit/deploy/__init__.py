"""Deployment artefacts for `rmqkit consume` on one work queue of a topology file
(docs/deploy.md): Kubernetes manifests scaled by KEDA (``k8s_manifests``) and a systemd unit
(``systemd_unit``), both from the ``ConsumeTarget`` that ``consume_target`` reads from the
topology, both running the consumer through one ``ConsumeCommand``.

Pure functions: nothing here reads files, asks the broker or prints; `rmqkit deploy` does
that around them.
"""

from rmqkit.deploy.command import ConsumeCommand, check_extra, check_handler, parse_grace
from rmqkit.deploy.k8s import K8sOptions, Manifests, check_name, default_name, k8s_manifests
from rmqkit.deploy.systemd import SystemdOptions, Unit, systemd_unit
from rmqkit.deploy.target import ConsumeTarget, TopologyView, consume_target

__all__ = [
    "ConsumeCommand",
    "ConsumeTarget",
    "K8sOptions",
    "Manifests",
    "SystemdOptions",
    "TopologyView",
    "Unit",
    "check_extra",
    "check_handler",
    "check_name",
    "consume_target",
    "default_name",
    "k8s_manifests",
    "parse_grace",
    "systemd_unit",
]
