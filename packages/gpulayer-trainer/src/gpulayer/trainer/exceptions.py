"""Lightning's ``MisconfigurationException``, raised where Lightning 2.6 raises it, and its ``PossibleUserWarning``.

Lightning's derives from ``Exception`` alone, so a ported script's ``except MisconfigurationException`` catches only
that class. GPUlayer's sites raise a subclass that is also the builtin type they have always raised (a
``ValueError`` for a bad value, a ``TypeError`` for a bad type, a ``RuntimeError`` for a call the hook forbids, a
``NotImplementedError`` for a missing step), so either name catches it. Where Lightning raises a builtin type
other than GPUlayer's, the class derives from both.
"""


class MisconfigurationException(Exception):
    """A misuse of the Trainer, a Module or a callback that Lightning 2.6 reports under this name."""

    argument: str | None = None  # the Trainer argument at fault, where a Trainer argument's check raised it


class MisconfiguredValueError(MisconfigurationException, ValueError):
    """A bad value for an argument, a returned object or a logged name."""


class MisconfiguredTypeError(MisconfigurationException, TypeError):
    """An argument or returned object of a type the API does not accept."""


class MisconfiguredRuntimeError(MisconfigurationException, RuntimeError):
    """A call the running hook does not allow (``self.log`` where Lightning forbids logging)."""


class MisconfiguredNotImplementedError(MisconfigurationException, NotImplementedError):
    """A method the stage needs that the module does not define."""


class HyperparameterClashError(RuntimeError, ValueError):
    """The module and the DataModule save one hyperparameter with different values: Lightning 2.6 raises a
    ``RuntimeError``; GPUlayer raised a ``ValueError`` before, so either catches it."""


class PossibleUserWarning(UserWarning):
    """Lightning's warning about a setting that may not be what the user meant (it can be a false positive)."""
