"""FGD and ``fgd-lookahead`` (``policy``). The rule, how fragmentation of a node is
measured for a task mix and how a placement is scored by its growth, is
``fragmentation``'s alone; beside it, what makes it fast without changing a decision:
``pool_scores`` (a pool's per-node U and each request's best candidate per node, kept
up to date through a cycle), ``node_scores`` (single nodes' scores in plain Python, bit
for bit numpy's, and the scorer kept between cycles) and ``task_mix`` (the count of the
pool's jobs by request, kept between cycles)."""
