"""Lightning 2.6's warnings around checkpoints that callbacks wrote, given by GPUlayer in the same cases: a checkpoint
resumed without the callbacks whose state it holds (``lightning/pytorch/trainer/call.py``,
``_call_callbacks_on_load_checkpoint``: EarlyStopping's patience would be silently dropped), and
``ckpt_path="best"`` with several ``ModelCheckpoint`` callbacks (``trainer/connectors/checkpoint_connector.py``)."""

import warnings

import torch
from torch.utils.data import DataLoader, TensorDataset

import gpulayer.trainer as gl
from gpulayer.callbacks import EarlyStopping, ModelCheckpoint

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import lightning.pytorch as pl

_CALLBACKS_GONE = "Be aware that when using `ckpt_path`"


def _loader() -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)), batch_size=4)


def _module(framework):
    base = gl.Module if framework is gl else pl.LightningModule

    class Fitter(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            loss = torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])
            self.log("loss", loss)
            return loss

        def test_step(self, batch, batch_idx):
            self.log("test_loss", torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1]))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Fitter()


def _trainer(framework, root, callbacks, **arguments):
    extra = {} if framework is gl else {"enable_progress_bar": False, "enable_model_summary": False}
    return framework.Trainer(
        accelerator="cpu", default_root_dir=root, logger=False, callbacks=callbacks, **(arguments | extra)
    )


def _caught(act) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        act()
    return caught


def _early_stopping(framework):
    return (EarlyStopping if framework is gl else pl.callbacks.EarlyStopping)(monitor="loss", patience=5)


def _checkpoint(framework, **arguments):
    return (ModelCheckpoint if framework is gl else pl.callbacks.ModelCheckpoint)(**arguments)


def _resumed_without_early_stopping(framework, root) -> list[str]:
    """A fit with EarlyStopping saved, then resumed by a Trainer without it: the messages of that warning."""
    module = _module(framework)
    first = _trainer(framework, root, [_early_stopping(framework)], max_epochs=1)
    first.fit(module, _loader())
    path = str(root / "saved.ckpt")
    first.save_checkpoint(path)
    again = _trainer(framework, root, [], max_epochs=2)
    caught = _caught(lambda: again.fit(_module(framework), _loader(), ckpt_path=path))
    return [str(w.message) for w in caught if str(w.message).startswith(_CALLBACKS_GONE)]


def test_resuming_without_a_callback_whose_state_was_saved_warns_as_in_lightning(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = _resumed_without_early_stopping(pl, tmp_path / "lightning")
    ours = _resumed_without_early_stopping(gl, tmp_path / "gpulayer")
    assert theirs == [
        "Be aware that when using `ckpt_path`, callbacks used to create the checkpoint need to be provided during "
        "`Trainer` instantiation. Please add the following callbacks: [\"EarlyStopping{'monitor': 'loss', 'mode': "
        "'min'}\"]."
    ]
    assert ours == theirs


def _best_of_several_checkpoints(framework, root, count: int) -> list[str]:
    """``test(ckpt_path="best")`` after a fit with ``count`` ModelCheckpoints: the categories of GPUlayer's and
    Lightning's warnings about several checkpoint callbacks (their texts differ)."""
    modes = ("min", "max")[:count]
    callbacks = [_checkpoint(framework, dirpath=root / mode, monitor="loss", mode=mode) for mode in modes]
    trainer = _trainer(framework, root, callbacks, max_epochs=1)
    trainer.fit(_module(framework), _loader())
    caught = _caught(lambda: trainer.test(dataloaders=_loader(), ckpt_path="best"))
    return [type(w.message).__name__ for w in caught if "ModelCheckpoint" in str(w.message)]


def test_best_with_several_checkpoint_callbacks_warns_as_in_lightning(tmp_path):
    for count, expected in ((2, ["UserWarning"]), (1, [])):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            theirs = _best_of_several_checkpoints(pl, tmp_path / f"lightning_{count}", count)
        ours = _best_of_several_checkpoints(gl, tmp_path / f"gpulayer_{count}", count)
        assert theirs == expected
        assert ours == theirs
