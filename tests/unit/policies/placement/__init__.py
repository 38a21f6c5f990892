"""Tests of gpusched.policies.placement: placement."""
