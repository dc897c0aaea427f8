"""``trainer.state``: what the Trainer is doing, with Lightning 2.6's names and values
(``lightning/pytorch/trainer/states.py``): the entry point running (``fn``), its status, and the stage within it.

The enums compare as Lightning's do (``LightningEnum``, from ``lightning_utilities``' ``StrEnum``): equal to any
string or enum whose value matches theirs ignoring case, hashed to match, and made from a name with ``from_str``.
"""

from __future__ import annotations

import enum
import warnings
from dataclasses import dataclass
from typing import Literal

Source = Literal["key", "value", "any"]


class LightningEnum(str, enum.Enum):
    """A string enum that equals any string (or enum) with its value in another case: ``TrainerFn.FITTING == "FIT"``."""

    @classmethod
    def from_str(cls, value: str, source: Source = "key") -> LightningEnum:
        """The member whose name (``source="key"``, any case), value (``"value"``, exactly) or either (``"any"``,
        names first) is ``value``; a ``ValueError`` naming the accepted ones otherwise."""
        if source in ("key", "any"):
            for name in cls.__members__:
                if name.lower() == value.lower():
                    return cls[name]
        if source in ("value", "any"):
            for member in cls:
                if member == value:
                    return member
        raise ValueError(f"Invalid match: expected one of {cls._accepted(source)}, but got {value}.")

    @classmethod
    def try_from_str(cls, value: str, source: Source = "key") -> LightningEnum | None:
        """``from_str``, or None with a warning naming the accepted strings."""
        try:
            return cls.from_str(value, source)
        except ValueError:
            warnings.warn(
                UserWarning(f"Invalid string: expected one of {cls._accepted(source)}, but got {value}."), stacklevel=2
            )
        return None

    @classmethod
    def _accepted(cls, source: Source) -> list[str]:
        names, values = list(cls.__members__), [member.value for member in cls]
        return names if source == "key" else values if source == "value" else names + values

    def __eq__(self, other: object) -> bool:
        value = other.value if isinstance(other, enum.Enum) else other
        return self.value.lower() == str(value).lower()

    def __hash__(self) -> int:
        return hash(self.value.lower())


class TrainerStatus(LightningEnum):
    INITIALIZING = "initializing"
    RUNNING = "running"
    FINISHED = "finished"
    INTERRUPTED = "interrupted"

    @property
    def stopped(self) -> bool:
        return self in (TrainerStatus.FINISHED, TrainerStatus.INTERRUPTED)


class TrainerFn(LightningEnum):
    """The entry point: ``trainer.state.fn == "fit"`` holds, as with Lightning's enum."""

    FITTING = "fit"
    VALIDATING = "validate"
    TESTING = "test"
    PREDICTING = "predict"


class RunningStage(LightningEnum):
    """What runs within the entry point: ``fit`` trains, validates and sanity-checks."""

    TRAINING = "train"
    SANITY_CHECKING = "sanity_check"
    VALIDATING = "validate"
    TESTING = "test"
    PREDICTING = "predict"

    @property
    def evaluating(self) -> bool:
        return self in (RunningStage.VALIDATING, RunningStage.TESTING, RunningStage.SANITY_CHECKING)

    @property
    def dataloader_prefix(self) -> str:
        """The prefix of the stage's loader hook: ``val`` for validation and the sanity check."""
        return "val" if self in (RunningStage.VALIDATING, RunningStage.SANITY_CHECKING) else self.value


# The stage each entry point starts in.
FIRST_STAGE = {
    TrainerFn.FITTING: RunningStage.TRAINING,
    TrainerFn.VALIDATING: RunningStage.VALIDATING,
    TrainerFn.TESTING: RunningStage.TESTING,
    TrainerFn.PREDICTING: RunningStage.PREDICTING,
}


@dataclass
class TrainerState:
    status: TrainerStatus = TrainerStatus.INITIALIZING
    fn: TrainerFn | None = None
    stage: RunningStage | None = None

    @property
    def finished(self) -> bool:
        return self.status == TrainerStatus.FINISHED

    @property
    def stopped(self) -> bool:
        return self.status.stopped
