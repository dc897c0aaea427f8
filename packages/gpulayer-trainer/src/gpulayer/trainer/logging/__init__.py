"""Metrics and loggers: what ``self.log`` keeps, the merged metric dicts, the progress line, which rows a logger
receives, the ``Logger`` interface and ``CSVLogger``, and ``gpulayer plot``."""
