"""Queue order: which pending job is offered first (priority, FIFO, fair share over
hierarchical quotas and decayed usage), and which jobs need not be offered at all (parking)."""
