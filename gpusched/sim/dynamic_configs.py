"""The configurations ``python -m gpusched.sim.dynamic --configs`` compares, as text:
``defaults[+quotas]`` or ``queue+placement[+backfill[=MINUTES]][+reserve=MINUTES][+depth=N][+quotas]``
(``parse_config``), with the preemptor's rules (``split_preemption_rules``) and maybe no
preemptor (``split_preemption``) appended."""
from __future__ import annotations

import math

from gpusched.config import DEFAULT_PLACEMENT
from gpusched.policies.placement.registry import parse_placement
from gpusched.policies.scheduler import SchedulerConfig

NO_PREEMPTION = "+no-preemption"


# Flags of a config that set the preemptor's rules: flag -> (PreemptionConfig field, type).
PREEMPTION_RULES = {"min-runtime": ("min_runtime_s", float), "growth": ("min_runtime_growth", float),
                    "max-min-runtime": ("max_min_runtime_s", float), "budget": ("preemption_budget", int),
                    "loss-per-wait": ("max_loss_per_wait", float), "reclaim-min-runtime": ("reclaim_min_runtime_s", float),
                    "reclaim-window": ("reclaim_window_s", float)}


def split_preemption(text: str) -> tuple[str, bool]:
    """``CONFIG+no-preemption`` -> (``CONFIG``, False): the run without a preemptor."""
    if text.endswith(NO_PREEMPTION):
        return text[: -len(NO_PREEMPTION)], False
    return text, True


def split_preemption_rules(text: str) -> tuple[str, dict]:
    """``CONFIG+min-runtime=30+budget=0`` -> (``CONFIG``, the PreemptionConfig fields they set)."""
    kept, rules = [], {}
    for flag in text.split("+"):
        name, _, value = flag.partition("=")
        if name in PREEMPTION_RULES and value:
            field_name, kind = PREEMPTION_RULES[name]
            rules[field_name] = kind(value)
        else:
            kept.append(flag)
    return "+".join(kept), rules


def parse_config(text: str, quotas, half_life_s: float, aging_s: float) -> tuple[str, SchedulerConfig]:
    """``defaults[+quotas]``: the placer's defaults: ``SchedulerConfig``'s (fair share, backfill,
    reservations after 5 minutes, depth 2) with ``gpusched.config.DEFAULT_PLACEMENT``. Else
    ``queue+placement[+backfill[=MINUTES]][+reserve=MINUTES][+depth=N][+quotas]``, e.g.
    ``fair-share+fgd+backfill+quotas``, with no reservation unless named: ``backfill``
    reserves for the first blocked job at once (EASY); ``backfill=60`` only for the first
    blocked job that waited 60 minutes; ``reserve=5`` for any blocked job that waited 5
    minutes, up to ``depth`` (default 2) a pool. ``placement`` may carry the policy's
    arguments (``fgd-lookahead:patience=0.2``); ``quotas`` enforces the workload's quota
    tree (guarantees, limits, weights)."""
    common: dict = {"half_life_s": half_life_s, "aging_s": aging_s}
    first, *flags = text.split("+")
    if first == "defaults":
        options = {**common, "placement": DEFAULT_PLACEMENT}
    else:
        queue, placement, *flags = text.split("+")
        name, args = parse_placement(placement)
        options = {**common, "queue": queue, "placement": name, "placement_args": args, "backfill": False,
                   "reserve_after_s": math.inf}
    for flag in flags:
        name, _, value = flag.partition("=")
        if name == "backfill" and not value:
            options.update(backfill=True)
        elif name == "backfill":   # the first blocked job once it waited: a wait bound of depth 1
            options.update(backfill=False, reserve_after_s=float(value) * 60, reservation_depth=1)
        elif name == "reserve" and value:
            options.update(reserve_after_s=float(value) * 60)
        elif name == "depth" and value:
            options.update(reservation_depth=int(value))
        elif flag == "quotas":
            options["quotas"] = quotas
        else:
            raise ValueError(f"unknown flag {flag!r} in {text!r}")
    return text, SchedulerConfig(**options)
