"""save_hyperparameters / hparams: each way of calling it, built on Lightning's classes and on ours, compared."""

import copy
import dataclasses
import inspect
import warnings
from argparse import Namespace

import pytest
import torch

from gpulayer.trainer.core.hyperparameters import AttributeDict, HyperparametersMixin

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from lightning.pytorch import LightningModule
    from lightning.pytorch.core.mixins import HyperparametersMixin as LightningMixin


class Net(HyperparametersMixin, torch.nn.Module):
    """What ``Module`` will be: the mixin on an ``nn.Module``."""


# Each of ours beside the Lightning class it stands for.
PAIRS = [pytest.param(HyperparametersMixin, LightningMixin, id="mixin"), pytest.param(Net, LightningModule, id="nn")]


def no_args(base):
    class M(base):
        def __init__(self, a, b="x", c=3.0, d=None):
            super().__init__()
            self.save_hyperparameters()

    return M(1, c=[4, 5])


def named(base):
    class M(base):
        def __init__(self, a, b, c=3.0):
            super().__init__()
            self.save_hyperparameters("a", "c")

    return M(1, "x")


def ignore_str(base):
    class M(base):
        def __init__(self, a, b, c=3.0):
            super().__init__()
            self.save_hyperparameters(ignore="b", logger=False)

    return M(1, "x")


def ignore_list(base):
    class M(base):
        def __init__(self, a, b, c=3.0):
            super().__init__()
            self.save_hyperparameters(ignore=["b", "c", "not_an_argument"])

    return M(1, "x")


def a_dict(base):
    class M(base):
        def __init__(self, cfg, other=1):
            super().__init__()
            self.save_hyperparameters(cfg)

    return M({"lr": 0.1, "layers": [8, 8]})


def a_namespace(base):
    class M(base):
        def __init__(self, other, args):
            super().__init__()
            self.save_hyperparameters(args)

    return M(1, Namespace(lr=0.1, name="run"))


def a_copy_of_a_dict_argument(base):
    # Lightning names the argument that equals the object, not the one that is it.
    class M(base):
        def __init__(self, other, cfg):
            super().__init__()
            self.save_hyperparameters(dict(cfg))

    return M(1, {"lr": 0.1})


def a_dict_that_is_not_an_argument(base):
    class M(base):
        def __init__(self, a):
            super().__init__()
            self.save_hyperparameters({"made": "here"})

    return M(1)


def an_empty_dict(base):
    class M(base):
        def __init__(self, a):
            super().__init__()
            self.save_hyperparameters({}, logger=False)

    return M(1)


def parent_and_child(base):
    class Parent(base):
        def __init__(self, a, b=2):
            super().__init__()
            self.save_hyperparameters()

    class Child(Parent):
        def __init__(self, c, a=10, **kwargs):
            super().__init__(a, **kwargs)

    return Child(3, b=4)


def child_saves_after_parent(base):
    class Parent(base):
        def __init__(self, a, b=2):
            super().__init__()
            self.save_hyperparameters()

    class Child(Parent):
        def __init__(self, c, b=5):
            super().__init__(1, b=b)
            self.save_hyperparameters(ignore="a")

    return Child(3)


def three_generations(base):
    class Grandparent(base):
        def __init__(self, a, shared="grandparent"):
            super().__init__()
            self.save_hyperparameters()

    class Parent(Grandparent):
        def __init__(self, b, shared="parent", **kwargs):
            super().__init__(shared=shared, **kwargs)

    class Child(Parent):
        def __init__(self, c, *args, **kwargs):
            super().__init__(*args, **kwargs)

    return Child(1, 2, a=3)


def star_args_and_kwargs(base):
    class M(base):
        def __init__(self, a, *args, extra=5, **kwargs):
            super().__init__()
            self.save_hyperparameters()

    return M(1, 2, 3, flag=True, name="n")


def changed_before_saving(base):
    class M(base):
        def __init__(self, a, b=2):
            super().__init__()
            a = a * 10
            self.save_hyperparameters()

    return M(1)


def saved_twice(base):
    class M(base):
        def __init__(self, a, b, c):
            super().__init__()
            self.save_hyperparameters("a")
            self.save_hyperparameters({"b": b})
            self.save_hyperparameters(Namespace(c=c))

    return M(1, 2, 3)


def from_a_helper_method(base):
    class M(base):
        def __init__(self, a, b=2):
            super().__init__()
            self._record()

        def _record(self):
            self.save_hyperparameters()

    return M(1)


def parent_without_super(base):
    # ``Parent.__init__(self)`` gives the child's __init__ no __class__ cell: Lightning does not see its arguments.
    class Parent(base):
        def __init__(self, a):
            super().__init__()
            self.save_hyperparameters()

    class Child(Parent):
        def __init__(self, b):
            Parent.__init__(self, 1)

    return Child(2)


def arguments_named_frame(base):
    class M(base):
        def __init__(self, a, frame=1, frame_args=2):
            super().__init__()
            self.save_hyperparameters()

    return M(0)


def built_inside_another_init(base):
    class M(base):
        def __init__(self, a):
            super().__init__()
            self.save_hyperparameters()

    class Builder:
        def __init__(self, size):
            super().__init__()
            self.model = M(size)

    return Builder(4).model


def built_inside_another_modules_init(base):
    # The outer __init__ is the next frame and its self is a mixin too: Lightning takes its arguments as well.
    class Inner(base):
        def __init__(self, a):
            super().__init__()
            self.save_hyperparameters()

    class Outer(base):
        def __init__(self, outer):
            super().__init__()
            self.inner = Inner(1)

    return Outer("o").inner


def built_by_a_function_inside_another_modules_init(base):
    # A frame that is not an __init__ ends the chain.
    class Inner(base):
        def __init__(self, a):
            super().__init__()
            self.save_hyperparameters()

    def build():
        return Inner(1)

    class Outer(base):
        def __init__(self, outer):
            super().__init__()
            self.inner = build()

    return Outer("o").inner


def given_a_frame(base):
    class Holder(base):
        def __init__(self):
            super().__init__()

    class M(base):
        def __init__(self, a, b=2):
            super().__init__()
            self.holder = Holder()
            self.holder.save_hyperparameters(frame=inspect.currentframe())

    return M(1).holder


def no_arguments_at_all(base):
    class M(base):
        def __init__(self):
            super().__init__()
            self.save_hyperparameters()

    return M()


def never_saved(base):
    class M(base):
        def __init__(self, a):
            super().__init__()

    return M(1)


CASES = [
    no_args,
    named,
    ignore_str,
    ignore_list,
    a_dict,
    a_namespace,
    a_copy_of_a_dict_argument,
    a_dict_that_is_not_an_argument,
    an_empty_dict,
    parent_and_child,
    child_saves_after_parent,
    three_generations,
    star_args_and_kwargs,
    changed_before_saving,
    saved_twice,
    from_a_helper_method,
    parent_without_super,
    arguments_named_frame,
    built_inside_another_init,
    built_inside_another_modules_init,
    built_by_a_function_inside_another_modules_init,
    given_a_frame,
    no_arguments_at_all,
    never_saved,
]


def _state(model):
    initial = model.hparams_initial
    return {
        "hparams": list(model.hparams.items()),  # in order, as a checkpoint stores them
        "hparams_initial": [
            (key, repr(value) if isinstance(value, torch.nn.Module) else value) for key, value in initial.items()
        ],
        "hparams_name": getattr(model, "_hparams_name", "<unset>"),
        "log_hyperparams": model._log_hyperparams,
        "repr": repr(model.hparams),
    }


def _lightning(case, base):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return case(base)


@pytest.mark.parametrize(("ours", "theirs"), PAIRS)
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.__name__)
def test_the_same_hparams_as_lightning(case, ours, theirs):
    model = case(ours)
    assert _state(model) == _state(_lightning(case, theirs))
    assert type(model.hparams) is AttributeDict
    assert type(model.hparams_initial) is AttributeDict


def test_a_dataclass_saves_its_init_fields():
    def case(base):
        @dataclasses.dataclass
        class Config(base):
            a: int
            b: str = "x"
            c: int = dataclasses.field(default=0, init=False)

            def __post_init__(self):
                super().__init__()
                self.save_hyperparameters()

        return Config(1)

    assert _state(case(HyperparametersMixin)) == _state(_lightning(case, LightningMixin))


@pytest.mark.parametrize(("ours", "theirs"), PAIRS)
def test_an_nn_module_argument_warns_as_lightning_does(ours, theirs):
    def case(base):
        class M(base):
            def __init__(self, backbone, width=4):
                super().__init__()
                self.save_hyperparameters()

        return M(backbone)

    backbone = torch.nn.Linear(2, 2)
    with warnings.catch_warnings(record=True) as lightning_warnings:
        warnings.simplefilter("always")
        expected = _state(case(theirs))
    with pytest.warns(UserWarning, match=r"save_hyperparameters\(ignore=\['backbone'\]\)") as our_warnings:
        model = case(ours)
    assert [str(w.message) for w in our_warnings] == [
        str(w.message) for w in lightning_warnings if "nn.Module" in str(w.message)
    ]
    assert our_warnings[0].filename == __file__  # points at the save_hyperparameters call
    assert _state(model) == expected  # the Linear compares by identity; hparams_initial holds a copy of it
    assert model.hparams.backbone is backbone


@pytest.mark.parametrize(("ours", "theirs"), PAIRS)
@pytest.mark.parametrize(
    ("value", "message"),
    [(5, "Primitives"), (2.5, "Primitives"), ([1, 2], "Unsupported config type"), (object(), "Unsupported")],
    ids=["int", "float", "list", "object"],
)
def test_a_single_value_that_is_not_a_mapping_is_refused_as_by_lightning(ours, theirs, value, message):
    def case(base):
        class M(base):
            def __init__(self, a):
                super().__init__()
                self.save_hyperparameters(value)

        return M(1)

    with pytest.raises(ValueError) as raised_by_lightning, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        case(theirs)
    with pytest.raises(ValueError, match=message) as raised:
        case(ours)
    assert str(raised.value) == str(raised_by_lightning.value)


@pytest.mark.parametrize("base", [HyperparametersMixin, Net])
def test_a_name_that_is_not_an_argument_raises_key_error(base):
    class M(base):
        def __init__(self, a):
            super().__init__()
            self.save_hyperparameters("b")

    with pytest.raises(KeyError, match="b"):
        M(1)


@pytest.mark.parametrize("base", [HyperparametersMixin, Net])
def test_hparams_is_mutable_and_hparams_initial_is_a_frozen_deep_copy(base):
    class M(base):
        def __init__(self, lr, layers):
            super().__init__()
            self.save_hyperparameters()

    layers = [8, 8]
    model = M(0.1, layers)
    model.hparams.lr = 0.5
    model.hparams["extra"] = True
    layers.append(16)
    model.hparams_initial["lr"] = 99
    assert model.hparams == {"lr": 0.5, "layers": [8, 8, 16], "extra": True}
    assert model.hparams_initial == {"lr": 0.1, "layers": [8, 8]}


def test_on_an_nn_module_the_hparams_are_neither_parameters_nor_submodules():
    class M(Net):
        def __init__(self, width, cfg):
            super().__init__()
            self.save_hyperparameters(ignore="cfg")
            self.layer = torch.nn.Linear(width, 1)

    model = M(3, {"unused": 1})
    assert list(model.state_dict()) == ["layer.weight", "layer.bias"]
    assert [name for name, _ in model.named_children()] == ["layer"]
    assert model.hparams.width == 3
    assert copy.deepcopy(model).hparams_initial == {"width": 3}


def test_attribute_dict_matches_lightnings():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from lightning.fabric.utilities.data import AttributeDict as LightningAttributeDict

    ours, theirs = AttributeDict(b=[1], a=2.5, long_key="v"), LightningAttributeDict(b=[1], a=2.5, long_key="v")
    for d in (ours, theirs):
        d.c = 3
        del d.a
    assert ours == theirs
    assert repr(ours) == repr(theirs)
    assert repr(AttributeDict()) == repr(LightningAttributeDict()) == ""
    assert ours.c == 3
    with pytest.raises(AttributeError, match="'AttributeDict' object has no attribute 'missing'"):
        _ = ours.missing
    with pytest.raises(KeyError):
        del ours.missing


@pytest.mark.parametrize(("ours", "theirs"), PAIRS)
def test_given_hyperparameters_replace_the_init_arguments_as_in_lightning(ours, theirs):
    """What a builder (LightningCLI) gives is saved in place of the arguments, with its instantiator, and ``ignore``
    still applies (Lightning's ``_given_hyperparameters_context``)."""
    from lightning.pytorch.core.mixins.hparams_mixin import _given_hyperparameters_context

    from gpulayer.trainer.core.hyperparameters import given_hyperparameters

    def build(base):
        class M(base):
            def __init__(self, a, b=2):
                super().__init__()
                self.save_hyperparameters(ignore="b")

        return M(1)

    config = {"a": 5, "b": 6, "_class_path": "pkg.M"}
    with given_hyperparameters(config, "gpulayer.cli.instantiate_module"):
        saved = dict(build(ours).hparams)
    with _given_hyperparameters_context(hparams=config, instantiator="lightning.pytorch.cli.instantiate_module"):
        expected = dict(build(theirs).hparams)
    assert saved.pop("_instantiator") == "gpulayer.cli.instantiate_module"
    assert expected.pop("_instantiator") == "lightning.pytorch.cli.instantiate_module"
    assert saved == expected == {"a": 5, "_class_path": "pkg.M"}
    assert dict(build(ours).hparams) == {"a": 1}  # outside the block, the arguments again
    assert config == {"a": 5, "b": 6, "_class_path": "pkg.M"}
