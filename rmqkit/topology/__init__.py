"""Topology files: the model, its expansion into broker objects, plan, declare and export."""

from rmqkit.topology.apply import DeclareResult, declare_topology, plan_topology
from rmqkit.topology.export import export_definitions
from rmqkit.topology.model import Topology, load_topology, parse_topology
from rmqkit.topology.plan import Change, Plan

__all__ = [
    "Change",
    "DeclareResult",
    "Plan",
    "Topology",
    "declare_topology",
    "export_definitions",
    "load_topology",
    "parse_topology",
    "plan_topology",
]
