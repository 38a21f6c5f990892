"""The preemptor's settings reach its preemption rules by name: every setting named for a
field of ``PreemptionConfig`` (a field in seconds without its ``_s``) sets that field."""
from __future__ import annotations

import dataclasses

from gpusched.config import PreemptorSettings
from gpusched.policies.preemption.victim_rules import PreemptionConfig
from gpusched_preemptor.main import preemption_config


def test_every_setting_named_for_a_rule_sets_it():
    changed = dict(min_runtime=11.0, min_runtime_growth=3.0, max_min_runtime=99.0, pool_min_runtime={"a": 5.0},
                   reclaim_min_runtime=7.0, preemption_budget=9, max_loss_per_wait=0.5, reclaim_window=13.0)
    config = preemption_config(PreemptorSettings(**changed))
    assert {name: getattr(config, name + ("" if name in ("min_runtime_growth", "preemption_budget", "max_loss_per_wait")
                                          else "_s")) for name in changed} == changed
    named = {f.name.removesuffix("_s") for f in dataclasses.fields(PreemptionConfig)}
    assert set(changed) == named & set(PreemptorSettings.model_fields)   # no rule's setting left out here
    defaults = PreemptionConfig()
    assert (config.max_victims, config.defrag_max_moves) == (defaults.max_victims, defaults.defrag_max_moves)
