"""A test rig of hosts (network namespaces on a bridge) for faults of a real cluster:
``net`` (the network and its faults), ``rig`` (brokers and services on it), ``nemesis``
(faults at random moments, healed), ``checker`` (invariants and recovery figures) and
``run`` (one run under faults). Used by tests/integration/test_network_faults.py and
bench/network_faults.py."""
