"""Python next to each slice's hosts: sidecars and the data loader built on them."""
