"""Tests of gpusched.policies.queueing: queue order, fair share and quotas."""
