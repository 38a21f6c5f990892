"""Tests of gpusched.policies.preemption: preemption, reclaim and defragmentation."""
