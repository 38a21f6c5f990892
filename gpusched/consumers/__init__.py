"""Consumers of the pool log outside the scheduler itself (billing, audit): they fold the
log with the same reducer, so they count what the log accepted, not what was proposed."""
