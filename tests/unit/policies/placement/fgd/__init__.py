"""Tests of gpusched.policies.placement.fgd: FGD and fgd-lookahead."""
