"""Where each stage's batches come from: its loaders, the distributed samplers, loaders rebuilt around them,
reading ahead, and seeds."""
