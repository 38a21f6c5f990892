"""Adapters for the event log: encoding, publishing, following and folding it, catching up, snapshots, dead letters."""
