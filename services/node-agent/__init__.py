"""Node-agent: one per node. Registers the node's GPUs, follows its pool log, runs the
work the log assigns to the node and reports started/finished back into the log."""
