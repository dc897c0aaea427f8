"""What a user subclasses and how it is called: ``Module``, ``DataModule``, ``Callback``, their hooks, the
optimizers they configure, ``self.log`` and ``load_from_checkpoint``."""
