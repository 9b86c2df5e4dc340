"""What happens to state: host snapshots, notebook healing, durable storage, orbax checkpoints, the compile cache."""
