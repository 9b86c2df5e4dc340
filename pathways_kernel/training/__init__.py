"""Training loops the kernel owns the step boundaries of: elastic execution."""
