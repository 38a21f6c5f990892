"""Tests of gpusched.policies.reservation: reservations and backfill."""
