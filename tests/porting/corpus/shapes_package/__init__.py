"""A project laid out as a package: the module, the data and the training script in modules of their own."""
