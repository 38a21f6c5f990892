"""The fgd policy's cases (``CASES``): small clusters, each with 100 pending jobs of one
``typical`` shape (``mix``), where the least growth of fragmentation decides."""
from __future__ import annotations

from tests.unit.core.builders import make_spec, share, whole
from tests.unit.policies.placement_cases import Case, cpu_job, node


def mix(spec, n: int = 100):
    return [spec] * n


ONE_GPU_8_CORES = make_spec(gpus=1, cpu=8000, mem=0)
HALF_GPU = make_spec(milli=500, cpu=1000, mem=0)
SIX_TENTHS = make_spec(milli=600, cpu=1000, mem=0)
TWO_GPUS = make_spec(gpus=2, cpu=1000, mem=0)

CASES = [
    # a: CPU-starved, its GPUs useless to the mix: taking one is free (-1000 -> 73);
    # b: its last GPU usable by the mix (0 -> 50). best-fit would take b (tighter).
    Case("uses GPUs stranded by CPU before good ones",
         [node("b"), node("a")], make_spec(gpus=1, cpu=2000, mem=0), "a",
         busy=[("a", (), 60_000), ("b", whole(0, 1, 2), 50_000)], typical=mix(ONE_GPU_8_CORES)),
    # GPU0 (700 free) would keep 200, useless to halves (+200); GPU1 keeps 500 (0).
    Case("picks the GPU whose leftover the mix can still use",
         [node("a", gpus=2)], make_spec(milli=500, cpu=1000, mem=0), "a", gpus=(1,),
         busy=[("a", share(0, 300), 0)], typical=mix(HALF_GPU)),
    # a's GPU has 500 free, already useless to 600s (-400); b's fresh GPU would keep 600 (0).
    Case("puts a share where the leftover is useless anyway",
         [node("b", gpus=1), node("a", gpus=1)], make_spec(milli=400, cpu=1000, mem=0), "a",
         busy=[("a", share(0, 500), 0)], typical=mix(SIX_TENTHS)),
    # a: 3 free GPUs keep a pair after taking one (0); b: 2 free GPUs lose their pair (+1000).
    Case("keeps pairs of free GPUs for 2-GPU tasks",
         [node("b"), node("a")], make_spec(gpus=1, cpu=1000, mem=0), "a",
         busy=[("a", whole(0), 0), ("b", whole(0, 1), 0)], typical=mix(TWO_GPUS)),
    # a: 10 free cores would drop under the mix's 8 (+4000); b keeps plenty (0).
    Case("CPU-only job does not strand GPUs",
         [node("a"), node("b")], cpu_job(4000), "b",
         busy=[("a", (), 54_000)], typical=mix(ONE_GPU_8_CORES)),
    Case("equal growth: first registered",
         [node("b"), node("a")], make_spec(gpus=1, cpu=1000, mem=0), "b", gpus=(0,), typical=mix(ONE_GPU_8_CORES)),
    Case("nothing fits",
         [node("a", gpus=1)], make_spec(gpus=2), None, typical=mix(ONE_GPU_8_CORES)),
]
