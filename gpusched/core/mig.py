"""MIG (Multi-Instance GPU) profiles and NVIDIA's placement rules.

An A100/H100/H200 is cut into 8 memory slices and 7 compute slices. A profile may start
only at certain slice positions and covers a fixed width; two instances may not overlap.
(From NVIDIA's MIG user guide, A100/H100 placement table.) We model the 8 memory slices
as a bitmask per GPU: the reducer checks overlap, the policies choose starts.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MigProfile:
    name: str
    compute: int          # compute slices out of 7
    width: int            # memory slices out of 8
    starts: tuple[int, ...]

    def mask(self, start: int) -> int:
        return ((1 << self.width) - 1) << start

    @property
    def milli(self) -> int:
        """GPU milli this instance accounts for (compute share of the whole GPU)."""
        return self.compute * 1000 // 7


PROFILES: dict[str, MigProfile] = {
    p.name: p
    for p in (
        MigProfile("1g", 1, 1, (0, 1, 2, 3, 4, 5, 6)),
        MigProfile("2g", 2, 2, (0, 2, 4)),
        MigProfile("3g", 3, 4, (0, 4)),
        MigProfile("4g", 4, 4, (0,)),
        MigProfile("7g", 7, 8, (0,)),
    )
}
FULL_MASK = (1 << 8) - 1


def parse_profile(text: str) -> MigProfile | None:
    """'3g', '3g.40gb' or '3g.71gb' -> the 3g profile; None when unknown."""
    # The reducer calls this for every MIG slot it checks or books: try the canonical
    # spelling as is before normalising the text.
    return PROFILES.get(text) or PROFILES.get(text.split(".", 1)[0].strip().lower())


def slice_mask(text: str, start: int) -> int:
    """The memory slices of a slot already checked against its profile (the reducer's
    booking paths): ``parse_profile(text).mask(start)``, where an unknown profile is a bug."""
    profile = parse_profile(text)
    if profile is None:
        raise ValueError(f"unknown MIG profile {text!r}")
    return profile.mask(start)


def fits_at(used_mask: int, profile: MigProfile, start: int) -> bool:
    return start in profile.starts and not used_mask & profile.mask(start)


def free_starts(used_mask: int, profile: MigProfile) -> list[int]:
    return [s for s in profile.starts if not used_mask & profile.mask(s)]


def _largest_placeable(used_mask: int) -> int:
    best = 0
    for p in PROFILES.values():
        if p.compute > best and free_starts(used_mask, p):
            best = p.compute
    return best


# Every mask of the 8 slices, computed once: MIG placement asks this for every free start
# of every GPU of every node it looks at.
_LARGEST = tuple(_largest_placeable(mask) for mask in range(FULL_MASK + 1))


def largest_placeable(used_mask: int) -> int:
    """Compute slices of the largest profile that still fits: a fragmentation measure."""
    if 0 <= used_mask <= FULL_MASK:
        return _LARGEST[used_mask]
    return _largest_placeable(used_mask)


# --- which slots a GPU takes, by its MIG mode -----------------------------------------
# A GPU's allowed MIG slots are one int, bit ``compute * 8 + start`` per (profile, start),
# computed once when its node registers, so the fit checks test a bit instead of walking
# the GPU's instances. ANY_SLOT (all bits) is a GPU that cuts slices on demand.
ANY_SLOT = -1
NO_SLOT = 0


def slot_bit(profile: MigProfile, start: int) -> int:
    return 1 << (profile.compute * 8 + start)


def allowed_slots(instances: list[tuple[str, int, int]], dynamic: bool) -> int:
    """The slots a MIG-enabled GPU takes, given its existing instances as (profile, start,
    memory slices): exactly those instances; with dynamic MIG also any slot that overlaps
    none of them (the agent creates it)."""
    allowed = NO_SLOT
    reserved = 0
    for name, start, slices in instances:
        profile = parse_profile(name)
        if profile is None or start not in profile.starts:
            continue   # a profile we do not model (e.g. +me, gfx): never offered
        allowed |= slot_bit(profile, start)
        reserved |= ((1 << (slices or profile.width)) - 1) << start
    if dynamic:
        for profile in PROFILES.values():
            for start in profile.starts:
                if not reserved & profile.mask(start):
                    allowed |= slot_bit(profile, start)
    return allowed
