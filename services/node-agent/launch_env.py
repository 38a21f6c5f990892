"""The environment a worker starts with: who it is in its gang and where to meet.

What ``torchrun`` and ``torch.distributed`` read (``MASTER_ADDR``, ``MASTER_PORT``,
``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``NODE_RANK``, ``LOCAL_WORLD_SIZE``) and a
host list, as Slurm's ``srun`` gives ``SLURM_JOB_NODELIST``. One gpusched worker is
one rank; a worker that runs ``torchrun`` itself uses the ``GPUSCHED_NNODES`` /
``NODE_RANK`` / ``GPUSCHED_RDZV_*`` values and lets torchrun set the per-process ranks
(docs/guide/workloads.md has the worked example). Pure: everything comes from the log.
"""
from __future__ import annotations

from typing import Mapping

from gpusched.core.state import JobState, NodeState


def node_addresses(job: JobState, nodes: Mapping[str, NodeState]) -> dict[str, str]:
    """The address of each node of the job's workers, as the log registered it."""
    return {w.node: _address(nodes.get(w.node), w.node) for w in job.workers}


def worker_env(job: JobState, worker: int, addresses: Mapping[str, str], rendezvous: str) -> dict[str, str]:
    """``rendezvous`` is "address:port": the attempt's (a gang's, from the log) or, for a
    single worker, a free port on its own node. ``addresses``: node name -> address
    (``node_addresses``, or the work view's); a node missing is reached by its name."""
    by_worker = sorted(job.workers, key=lambda w: w.worker)
    node_order: list[str] = []
    for w in by_worker:
        if w.node not in node_order:
            node_order.append(w.node)
    me = next(w for w in by_worker if w.worker == worker)
    local = [w.worker for w in by_worker if w.node == me.node]
    address, _, port = rendezvous.rpartition(":")
    peers = [addresses.get(name) or name for name in node_order]
    array = {"GPUSCHED_ARRAY_JOB_ID": job.array_of, "GPUSCHED_ARRAY_INDEX": str(job.array_index)} if job.array_of else {}
    return array | {
        "GPUSCHED_JOB_ID": job.job_id,
        "GPUSCHED_ATTEMPT": str(job.attempt),
        "GPUSCHED_WORKER": str(worker),
        "GPUSCHED_WORKERS": str(job.spec.workers),
        "MASTER_ADDR": address,
        "MASTER_PORT": port,
        "WORLD_SIZE": str(job.spec.workers),
        "RANK": str(worker),
        "LOCAL_RANK": str(local.index(worker)),
        "LOCAL_WORLD_SIZE": str(len(local)),
        "NODE_RANK": str(node_order.index(me.node)),
        "GPUSCHED_NNODES": str(len(node_order)),
        "GPUSCHED_NODELIST": ",".join(node_order),
        "GPUSCHED_NODE_ADDRESSES": ",".join(peers),
        # A new id per attempt: a stale worker of an earlier attempt cannot join.
        "GPUSCHED_RDZV_ID": f"{job.job_id}-{job.attempt}",
        "GPUSCHED_RDZV_ENDPOINT": rendezvous,
    }


def service_env(job: JobState, port: int = 0) -> dict[str, str]:
    """What a service's replica is told: its service and replica (job id) and, where its
    spec has ``serve_port``, ``PORT``, the port this worker serves on (worker 0's is the
    replica's endpoint). Empty for any other job."""
    if not job.spec.service:
        return {}
    return {"GPUSCHED_SERVICE": job.spec.service, "GPUSCHED_REPLICA": job.job_id,
            **({"PORT": str(port)} if port else {})}


def _address(node: NodeState | None, name: str) -> str:
    return (node.info.address if node is not None else "") or name
