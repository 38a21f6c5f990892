"""Capacity kept for a job that cannot start yet: EASY backfill's reservation for the head
of line, and the nodes a preemption freed for the job it was made for (nominations)."""
