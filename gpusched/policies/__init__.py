"""Scheduling policies: pure functions over a ``ClusterState``, chosen by name.

One scheduling cycle (``scheduler``), in the stages of Kubernetes' scheduling framework:

- queue order (``queueing``): priority, FIFO, fair share over quotas; parking;
- filter and score (``placement``, with ``gpu_fit`` the one fit rule): where each worker goes;
- reserve (``statement``): every tentative change, with checkpoint and rollback;
- capacity kept for a job that waits (``reservation``): backfill's reservation, nominations;
- post-filter (``preemption``): victims to stop or move for a job that does not fit;
- supervision (``supervision``): nodes lost, attempts hung or over their time.

The caller binds by appending the cycle's proposals to the log.
"""
