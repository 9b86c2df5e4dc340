"""Core: the session (the one JAX client), its slices and chips, meshes, the event log, errors."""
