"""Generated protobuf/gRPC code for proto/gpusched/v1 (built by deploy/setup.sh, not committed)."""
