"""DataModule: prepare_data, setup(stage), teardown(stage) and its loaders, through every entry point."""

import pytest


def test_fit_validate_test_predict_with_a_datamodule(differential):
    """DataModule hooks run before the callback's and module's (Lightning's ``_call_setup_hook``); its loaders replace
    the module's."""
    both = differential(data_source="datamodule", stages=("fit", "validate", "test", "predict"))
    fit = both.lightning.hooks["fit"]
    assert fit.index("D.setup(fit)") < fit.index("C.setup(fit)") < fit.index("M.setup(fit)")


@pytest.mark.parametrize("stage", ["validate", "test", "predict"])
def test_evaluation_entry_points_with_a_datamodule_alone(differential, stage):
    differential(data_source="datamodule", stages=(stage,))


@pytest.mark.parametrize("passed", ["datamodule_positional", "datamodule_as_dataloaders"])
def test_a_datamodule_passed_where_loaders_go_is_the_datamodule(differential, passed):
    """``fit(model, dm)``, ``test(model, dm)`` and ``test(model, dataloaders=dm)``: Lightning takes a DataModule in
    the loaders' place, in every entry point."""
    differential(data_source=passed, stages=("fit", "validate", "test", "predict"))


def test_datamodule_without_validation(differential):
    differential(data_source="datamodule", val_sizes=())


def test_datamodule_with_two_validation_loaders_and_random_training(differential):
    differential(data_source="datamodule", val_sizes=(6, 3), shuffle=True, dropout=0.3, trainer=dict(max_epochs=3))
