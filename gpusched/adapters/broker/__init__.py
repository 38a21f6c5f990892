"""Adapters for the Kafka cluster itself: topics, principals and ACLs, security settings, the dev PKI, broker
loss, and raw reads of its topics (``TopicReader``)."""
