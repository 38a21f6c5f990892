"""Post-filter: when a job cannot be placed, which running jobs to stop for it (preemption
by priority or quota reclaim) or to move (defragmentation); one victim search serves both."""
