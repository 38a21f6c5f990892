"""Adapters for traffic with the nodes: heartbeats, their report topics and the relay, work views, usage records."""
