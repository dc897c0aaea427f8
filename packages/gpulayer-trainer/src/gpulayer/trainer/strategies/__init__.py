"""Where the module lives and how the ranks talk: the ``Strategy`` contract, one device and DDP, precision, and
the processes a Trainer trains on."""
