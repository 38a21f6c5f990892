"""Placer: owns pool partitions through a consumer group, rebuilds their state from the
log and runs scheduling cycles that append placement proposals."""
