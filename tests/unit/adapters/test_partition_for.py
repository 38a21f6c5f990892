"""``partition_for`` (cached) picks the partition Kafka's default partitioner picks for
the pool as key, asked once or many times."""
from __future__ import annotations

from aiokafka.partitioner import DefaultPartitioner

from gpusched.adapters.log.publisher import partition_for


def test_the_partition_of_kafkas_default_partitioner_every_time():
    pools = [f"pool-{i}" for i in range(200)] + ["default", ""]
    for partitions in (1, 4, 7):
        every = list(range(partitions))
        expected = [DefaultPartitioner()(p.encode(), every, every) for p in pools]
        for _ in range(2):   # the second time from the cache
            assert [partition_for(p, partitions) for p in pools] == expected
