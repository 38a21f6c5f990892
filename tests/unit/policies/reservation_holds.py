"""``hold_changes``: some random free capacity of one node, as a reservation would hold it."""
from __future__ import annotations

from hypothesis import strategies as st

from gpusched.core.mig import FULL_MASK


def hold_changes(state, data) -> tuple[tuple, tuple[str, ...]]:
    """Some free capacity of one node, as a reservation would hold it."""
    node = data.draw(st.sampled_from(sorted(state.nodes)))
    n = state.nodes[node]
    changes = [(n, "used_cpu", data.draw(st.integers(0, max(0, n.free_cpu)))),
               (n, "used_mem", data.draw(st.integers(0, max(0, n.free_mem))))]
    for gpu in n.gpus:
        if gpu.used_milli == 0 and gpu.info.mig_capable and data.draw(st.booleans()):
            bits = data.draw(st.integers(1, FULL_MASK)) & ~gpu.mig_mask
            changes.append((gpu, "mig_mask", bits))
        elif not gpu.mig_mask:
            changes.append((gpu, "used_milli", data.draw(st.integers(0, 1000 - gpu.used_milli))))
    return tuple(c for c in changes if c[2]), (node,)
