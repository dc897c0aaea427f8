"""Lightning's profilers: the base ``Profiler``, ``PassThroughProfiler`` (the default), ``SimpleProfiler``,
``AdvancedProfiler`` and ``PyTorchProfiler``, and how a Trainer given one times its hooks and loops."""
