"""The Environment section's rank variables across nodes: once where the nodes agree,
per node where they differ or only some nodes have one."""

from __future__ import annotations

from areal_console.core.report.model import NodeVersions, ReportInputs
from areal_console.core.report.sections import environment


def node(name: str, env: dict[str, str]) -> NodeVersions:
    system = {"os": "Debian GNU/Linux 12", "kernel": "6.1", "machine": "x86_64"}
    interp = {"pid": 7, "python": "3.11.7", "executable": "/usr/bin/python3",
              "torch": {"version": "2.6.0", "cuda": "12.4", "nccl": "2.21.5"},
              "packages": {}, "environment": env}  # fmt: skip
    return NodeVersions(name, system, [interp], ["NVIDIA H100"] * 8)


def test_rank_variables_once_when_nodes_agree_per_node_when_not() -> None:
    inputs = ReportInputs(versions=[
        node("gpu-1", {"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "eth0", "HF_TOKEN": "***"}),
        node("gpu-2", {"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "ib0"}),
    ])  # fmt: skip
    text = "\n".join(environment(inputs))
    assert "All 2 nodes (gpu-1, gpu-2) agree:" in text
    assert "- GPUs: 8 x NVIDIA H100; driver not found" in text
    assert "torch 2.6.0 (CUDA 12.4, NCCL 2.21.5)" in text
    assert "\nNCCL_DEBUG=INFO\n" in text
    assert "\nNCCL_SOCKET_IFNAME: eth0 on gpu-1; ib0 on gpu-2\n" in text
    assert "\nHF_TOKEN=*** (only on gpu-1)\n" in text
