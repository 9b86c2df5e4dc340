"""Telemetry (sampling, aggregation), the monitor comm protocol and transport, the notebook widget."""
