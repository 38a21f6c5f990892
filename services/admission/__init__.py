"""Admission: validates job specs, appends JobSubmitted/JobCancelled to the pool log, and
answers job and cluster queries from its own read model, rebuilt from the log."""
