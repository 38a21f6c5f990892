"""Adapters for the gRPC API: the server, its security, callers' identity and permissions, messages from the state."""
