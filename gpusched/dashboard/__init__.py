"""``gpusched dashboard``: a read-only web page for the cluster, read from admission over
gRPC as the CLI does (docs/guide/dashboard.md)."""
