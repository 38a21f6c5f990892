"""The node-agent's own gRPC API: its inventory, and fault injection on simulated NVML."""
from __future__ import annotations

import grpc

from gpusched.adapters.log.codec import to_proto
from gpusched.adapters.gpus.gpu_health import SimulatedNvml
from gpusched.v1 import node_agent_pb2, node_agent_pb2_grpc, types_pb2
from gpusched_node_agent.agent import NodeAgent


class NodeAgentServicer(node_agent_pb2_grpc.NodeAgentServiceServicer):
    def __init__(self, agent: NodeAgent, backend) -> None:
        self.agent = agent
        self.backend = backend

    async def GetInventory(self, request, context):
        info = self.agent.info
        return node_agent_pb2.Inventory(
            node=to_proto(info, types_pb2.NodeInfo), gpu_backend=self.backend.name,
            running=[f"{j}/{a}/{w}" for j, a, w in self.agent.running],
            health=[node_agent_pb2.GpuHealth(index=g.index, healthy=g.index not in self.agent.health,
                                             reason=self.agent.health.get(g.index, ""))
                    for g in info.gpus],
        )

    async def InjectGpuFault(self, request, context):
        if not isinstance(self.backend, SimulatedNvml):
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "node uses real NVML; faults cannot be injected")
        if not 0 <= request.gpu_index < len(self.agent.info.gpus):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"gpu_index: node has GPUs 0..{len(self.agent.info.gpus) - 1}")
        if not request.ecc and request.xid <= 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "xid: give a positive XID or set ecc")
        self.backend.inject(request.gpu_index, request.xid, request.ecc)
        return node_agent_pb2.InjectGpuFaultResponse()
