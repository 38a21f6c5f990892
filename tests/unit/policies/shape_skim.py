"""Cycles that offer every job they take, though a job of its shape failed earlier in the
cycle: the reference for what skipping a failed shape (``scheduler._Cycle``) leaves out."""
from __future__ import annotations

import pytest

from gpusched.policies.scheduler import _Cycle


class Forgetful(set):
    """A cycle's failed shapes that it never finds again."""

    def __contains__(self, item) -> bool:
        return False


def offer_every_shape(patch: pytest.MonkeyPatch) -> None:
    """Within ``patch``: every cycle forgets which shapes failed, so offers every job."""
    init = _Cycle.__init__

    def forgetful(run, *args) -> None:
        init(run, *args)
        run.failed = Forgetful()
    patch.setattr(_Cycle, "__init__", forgetful)
