"""Adapters for the GPUs: inventory and health from NVML, usage sampling, and the NVML stand-in for simulated nodes."""
