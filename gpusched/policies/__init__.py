"""Scheduling policies: pure functions over a ``ClusterState``, registered by name.

Extension points of one scheduling cycle (after Kubernetes' scheduling framework):
queue sort (``queue``) -> place a gang: filter + score nodes (``placement``) -> reserve
(``statement``) -> the caller binds by appending ``JobPlaced`` proposals to the log.
"""
