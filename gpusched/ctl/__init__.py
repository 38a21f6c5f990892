"""The user and operator commands of ``gpusched`` (submit, get, describe, cancel, watch,
top, cordon, policy), on click; ``gpusched.cli`` is the entry point. docs/reference/cli.md."""
