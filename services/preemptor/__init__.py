"""Preemptor: owns pool partitions through its own consumer group and appends the
disruptive decisions — preemptions for priority and quota reclaim, defragmenting
migrations, lost nodes (from the heartbeats topic) and hung attempts."""
