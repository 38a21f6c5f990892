"""The preemptor's configuration for tests of its rules other than "a preemption pays for
itself" (tests/unit/policies/preemption/test_preemption_cost.py): their jobs have waited seconds,
which pay for no victim's lost work, so that rule is off (``max_loss_per_wait`` infinite)
unless a test sets it."""
from __future__ import annotations

import math

from gpusched.policies.preemption.victim_rules import PreemptionConfig


def other_rules(**values) -> PreemptionConfig:
    """``PreemptionConfig(**values)`` with no bound on the work lost for a wait."""
    return PreemptionConfig(**{"max_loss_per_wait": math.inf, **values})
