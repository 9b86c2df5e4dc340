"""The embedded backend: CPU devices as slices, and the faults a real cluster would bring (loss, chaos, health)."""
