"""Resuming ``fit`` from a checkpoint (Lightning 2.6: ``Trainer._run``, ``_CheckpointConnector``): a run saves with
``trainer.save_checkpoint``, then a new Trainer and a new module resume with ``fit(..., ckpt_path=...)``.

The default scenario has 3 training batches per epoch (10 samples in batches of 4), 2 validation batches, no
shuffling and no dropout, so both frameworks read the same batches in the same order and a run resumed from
the end of an epoch must end where an unbroken one does, hooks and weights alike. Each framework resumes from
its own file: resuming across the two trainers is not a goal (ADR 0008).
"""

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.optim.lr_scheduler import StepLR

FRAMEWORKS = ("lightning", "gpulayer")
BATCHES = 3  # training batches per epoch in the default scenario


def saves_at(path, epoch, batch_idx=None):
    """Callback bodies that save ``path`` once: after training batch ``batch_idx`` of ``epoch`` (mid-epoch), or
    in ``on_train_epoch_end`` of ``epoch`` when ``batch_idx`` is None (where Lightning's ModelCheckpoint saves)."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, index):
        if (trainer.current_epoch, index) == (epoch, batch_idx):
            trainer.save_checkpoint(path)

    def on_train_epoch_end(self, trainer, pl_module):
        if batch_idx is None and trainer.current_epoch == epoch:
            trainer.save_checkpoint(path)

    return {"callback": {"on_train_batch_end": on_train_batch_end, "on_train_epoch_end": on_train_epoch_end}}


def saves_after_fit(path):
    """Scenario fields that save ``path`` once ``fit`` has returned."""
    return {"after": lambda trainer: trainer.save_checkpoint(path)}


@pytest.fixture
def resume(run, tmp_path):
    """``resume(first, then, save, **fit_arguments)``: under each framework, run scenario ``first`` plus the
    fields ``save(path)`` returns, then scenario ``then`` on a new Trainer and a new module with
    ``fit(..., ckpt_path=path, **fit_arguments)``. Returns ``{framework: SimpleNamespace(saved, resumed)}``."""

    def run_both(first, then, save, **fit_arguments):
        records = {}
        for framework in FRAMEWORKS:
            path = tmp_path / f"{framework}.ckpt"
            saved = run(framework, **first, **save(path))
            assert path.is_file(), f"{framework} saved no checkpoint"
            resumed = run(framework, **then, stage_arguments={"fit": {"ckpt_path": path, **fit_arguments}})
            records[framework] = SimpleNamespace(saved=saved, resumed=resumed)
        return records

    return run_both


@pytest.fixture
def assert_same_runs(list_differences):
    """``assert_same_runs(runs, *parts)``: every difference between the frameworks' ``parts`` ("saved",
    "resumed") of ``runs``, in one failure."""

    def check(runs, *parts):
        problems = [
            f"{part} run: {problem}"
            for part in parts
            for problem in list_differences(getattr(runs["lightning"], part), getattr(runs["gpulayer"], part))
        ]
        assert not problems, "GPUlayer differs from Lightning:\n" + "\n".join(problems)

    return check


def sanity_steps(result):
    return [call for call in result.calls if call[0] == "sanity"]


def train_calls(result):
    """(epoch, batch_idx, global_step) of every training_step."""
    return [(epoch, batch_idx, step) for stage, epoch, batch_idx, step in result.calls if stage == "train"]


def assert_resumed_like_unbroken(runs, framework, first_trained_epoch):
    """The saving run doubles as the unbroken run: same limits, so the resumed one must end with its weights
    and repeat its training steps from ``first_trained_epoch`` on."""
    run = runs[framework]
    torch.testing.assert_close(run.resumed.weights, run.saved.weights)
    assert train_calls(run.resumed) == [c for c in train_calls(run.saved) if c[0] >= first_trained_epoch]


# ---- end of an epoch: everything must agree ------------------------------------------------------------------------


def save_user_state(self, checkpoint):
    checkpoint["user_state"] = self.trainer.global_step


def load_user_state(self, checkpoint):
    self.record("loaded", (checkpoint["epoch"], checkpoint["global_step"], checkpoint["user_state"]))


@pytest.mark.parametrize(
    "variant",
    [
        dict(),
        dict(then_seed=7),  # a different initialization: the checkpoint's weights must win
        dict(trainer=dict(num_sanity_val_steps=0)),
        dict(trainer=dict(num_sanity_val_steps=1, limit_val_batches=1)),
        dict(val_sizes=()),  # no validation: no sanity check either
        dict(trainer=dict(accumulate_grad_batches=2)),
        pytest.param(
            dict(module={"on_save_checkpoint": save_user_state, "on_load_checkpoint": load_user_state}),
            id="module-on_save_checkpoint-on_load_checkpoint",
        ),
        dict(fit_arguments=dict(weights_only=True)),
        dict(fit_arguments=dict(weights_only=False)),
    ],
    ids=str,
)
def test_resume_from_the_end_of_an_epoch(resume, variant, assert_same_runs):
    """Saved in ``on_train_epoch_end`` of epoch 0 of a ``max_epochs=3`` run, resumed by a new Trainer with
    ``max_epochs=3``: Lightning's resume order (``Trainer._run``: module, then callback ``on_load_checkpoint``
    before ``configure_optimizers``; the sanity check again), then epochs 1 and 2 as the unbroken run had them.
    Lightning's plain checkpoint loads with torch's default ``weights_only`` (True on torch 2.13), so
    ``weights_only=None``, True and False all resume.

    Lightning restores the loop progress after ``on_fit_start`` but counts the checkpoint's epoch as completed
    only when training starts (``FitLoop.on_run_start``), so its resumed sanity check runs with ``current_epoch``
    still the saved epoch, 0; the recorded (stage, epoch, batch_idx, global_step) calls compare that too.
    """
    trainer = variant.get("trainer", {})
    common = dict(val_sizes=variant.get("val_sizes", (6,)), module=variant.get("module", {}))
    first = dict(common, trainer=dict(trainer, max_epochs=3))
    then = dict(common, trainer=dict(trainer, max_epochs=3), seed=variant.get("then_seed", 1234))
    runs = resume(first, then, lambda path: saves_at(path, epoch=0), **variant.get("fit_arguments", {}))

    resumed = runs["lightning"].resumed
    sanity = bool(trainer.get("num_sanity_val_steps", 2) and common["val_sizes"])
    assert resumed.hooks["fit"][:11] == [  # Lightning's resume order
        "M.configure_callbacks",
        "M.prepare_data",
        "C.setup(fit)",
        "M.setup(fit)",
        "M.configure_model",
        "M.on_load_checkpoint",
        "C.on_load_checkpoint",
        "M.configure_optimizers",
        "C.on_fit_start",
        "M.on_fit_start",
        "C.on_sanity_check_start" if sanity else "M.train_dataloader",
    ]
    steps = 2 if trainer.get("accumulate_grad_batches") == 2 else BATCHES  # optimizer steps per epoch
    assert resumed.counters["fit"] == (3 * steps, 3)
    if "module" in variant:
        assert resumed.extra["loaded"] == [(0, steps, steps)]
    for framework in FRAMEWORKS:
        assert_resumed_like_unbroken(runs, framework, first_trained_epoch=1)
    assert_same_runs(runs, "saved", "resumed")


def test_resume_from_a_checkpoint_saved_after_fit_returned(resume, assert_same_runs):
    """``trainer.save_checkpoint`` once ``fit(max_epochs=2)`` is over, then a new Trainer with ``max_epochs=4``:
    it goes on at epoch 2, ``global_step`` 6, after a new sanity check (which sees epoch 2 in both)."""
    runs = resume(dict(trainer=dict(max_epochs=2)), dict(trainer=dict(max_epochs=4), seed=7), saves_after_fit)
    resumed = runs["lightning"].resumed
    assert runs["lightning"].saved.hooks["after"] == ["C.on_save_checkpoint", "M.on_save_checkpoint"]
    assert sanity_steps(resumed) == [("sanity", 2, 0, 6), ("sanity", 2, 1, 6)]
    assert train_calls(resumed)[:3] == [(2, 0, 6), (2, 1, 7), (2, 2, 8)]
    assert resumed.counters["fit"] == (12, 4)
    assert_same_runs(runs, "saved", "resumed")


@pytest.mark.parametrize(
    ("then", "unbroken"),
    [
        (dict(max_epochs=3), (9, 3)),
        (dict(max_epochs=1), (3, 1)),  # the checkpoint already holds every epoch asked for: only the sanity check
    ],
    ids=str,
)
def test_resume_with_epoch_limits(resume, then, unbroken, assert_same_runs):
    """Saved at the end of epoch 0 of a ``max_epochs=1`` run (``global_step`` 3), resumed under other limits.
    ``unbroken`` is (``global_step``, ``current_epoch``) of an uninterrupted run with those limits."""
    runs = resume(dict(trainer=dict(max_epochs=1)), dict(trainer=then), lambda path: saves_at(path, epoch=0))
    assert runs["gpulayer"].resumed.counters["fit"] == unbroken
    assert_same_runs(runs, "resumed")


@pytest.mark.parametrize(
    ("then", "unbroken"),
    [
        (dict(max_steps=8), (8, 3)),  # max_epochs unset: ends mid-epoch 2, which counts (_FitLoop.on_advance_end)
        (dict(max_epochs=-1, max_steps=7), (7, 3)),
        (dict(max_epochs=5, max_steps=5), (5, 2)),
        (dict(max_epochs=2, max_steps=20), (6, 2)),
        (dict(max_steps=3), (3, 1)),
    ],
    ids=str,
)
def test_resume_with_max_steps_follows_the_documented_end_of_epoch_resume(resume, then, unbroken):
    """A deliberate difference (porting guide): with ``max_steps`` set, Lightning 2.6 treats an end-of-epoch
    resume as a restart in the middle of the saved epoch. It skips the sanity check and runs the saved epoch's
    ``on_train_epoch_end`` a second time; with ``max_epochs=2, max_steps=20`` it then trains no epoch at all
    and ends at (3, 2), and with ``max_steps=3`` it reports ``current_epoch`` 0 (on a resume, the
    ``_FitLoop.restarting`` setter marks a finished epoch as still running whenever ``max_steps`` is set). That
    contradicts its own documented resume, which it follows without ``max_steps``: continue with the next epoch,
    sanity check included. GPUlayer follows it: the resumed run repeats an unbroken run's steps and ends with its
    counters and weights."""
    runs = resume(dict(trainer=dict(max_epochs=1)), dict(trainer=then), lambda path: saves_at(path, epoch=0))
    ours = runs["gpulayer"].resumed
    assert ours.counters["fit"] == unbroken
    assert sanity_steps(ours), "the sanity check runs again after an end-of-epoch resume"
    assert ours.hooks["fit"].count("C.on_train_epoch_end") == unbroken[1] - 1
    unbroken_run = runs["gpulayer"]
    assert train_calls(ours) == [
        (epoch, batch, step)
        for epoch in range(1, unbroken[1])
        for batch in range(BATCHES)
        if (step := epoch * BATCHES + batch) < unbroken[0]
    ], unbroken_run


def _momentum_and_scheduler(interval):
    def configure_optimizers(module):
        optimizer = module.sgd(lr=0.2)  # SGD with momentum 0.9: its buffers must come back too
        scheduler = StepLR(optimizer, step_size=1 if interval == "epoch" else 2, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": interval}}

    return configure_optimizers


@pytest.mark.parametrize("num_sanity_val_steps", [2, 0])
@pytest.mark.parametrize("interval", ["epoch", "step"])
def test_resume_restores_momentum_and_the_scheduler(resume, interval, num_sanity_val_steps, assert_same_runs):
    """StepLR by epoch or by step and SGD momentum, saved at the end of epoch 1 of 3: the learning rate each
    resumed ``training_step`` sees and the final weights match Lightning and the unbroken run, which they would
    not if either state were lost."""
    trainer = dict(max_epochs=3, num_sanity_val_steps=num_sanity_val_steps)
    scenario = dict(trainer=trainer, configure_optimizers=_momentum_and_scheduler(interval))
    runs = resume(scenario, dict(scenario, seed=7), lambda path: saves_at(path, epoch=1))
    for framework in FRAMEWORKS:
        assert_resumed_like_unbroken(runs, framework, first_trained_epoch=2)
        assert runs[framework].resumed.learning_rates == runs[framework].saved.learning_rates[2 * BATCHES :]
    expected = [0.2 * 0.5**2] * 3 if interval == "epoch" else [0.2 * 0.5**3, 0.2 * 0.5**3, 0.2 * 0.5**4]
    assert runs["lightning"].resumed.learning_rates == pytest.approx(expected)
    assert_same_runs(runs, "saved", "resumed")


def test_resume_from_last(run, tmp_path, assert_same_runs):
    """``ckpt_path="last"``: the newest ``last*.ckpt`` in the checkpoint callbacks' folders (here the default
    ``ModelCheckpoint``'s, ``<root>/checkpoints``); afterwards the same checkpoint files are on disk."""

    def save_last(self, trainer, pl_module):
        if trainer.current_epoch == 0:
            trainer.save_checkpoint(Path(trainer.checkpoint_callback.dirpath) / "last.ckpt")

    runs, files = {}, {}
    for framework in FRAMEWORKS:
        root = tmp_path / framework
        # logger=False in both (the harness's Lightning default): with a logger, each run has its own version_N
        # folder, and "last" finds nothing in the new one.
        trainer = dict(max_epochs=1, enable_checkpointing=True, default_root_dir=root, logger=False)
        saved = run(framework, trainer=trainer, callback={"on_train_epoch_end": save_last})
        resumed = run(  # the default ModelCheckpoint warns that its folder is not empty, as Lightning's does
            framework,
            trainer=dict(trainer, max_epochs=2),
            stage_arguments={"fit": {"ckpt_path": "last"}},
            seed=7,
            documented_warning=True,
        )
        runs[framework] = SimpleNamespace(saved=saved, resumed=resumed)
        files[framework] = sorted(path.name for path in (root / "checkpoints").iterdir())
    assert runs["lightning"].resumed.counters["fit"] == (6, 2)
    # last.ckpt was written before the default checkpoint's epoch-0 save (user callbacks first), so the state it
    # restores names no previous best, and the resumed run keeps epoch=0-step=3.ckpt.
    assert files["gpulayer"] == files["lightning"] == ["epoch=0-step=3.ckpt", "epoch=1-step=6.ckpt", "last.ckpt"]
    assert_same_runs(runs, "saved", "resumed")


def test_resume_from_best_on_the_same_trainer(run, assert_same_runs):
    """``ckpt_path="best"`` on the Trainer whose default checkpoint saved ``epoch=1-step=6.ckpt``: a second ``fit``
    restores it (``on_load_checkpoint``, the sanity check) and, every epoch being done, trains nothing more.
    (A new Trainer has no best checkpoint yet, so "best" is tested on the same one.)"""
    scenario = dict(
        trainer=dict(max_epochs=2, enable_checkpointing=True),
        stages=("fit", "fit"),
        stage_arguments={"fit#2": {"ckpt_path": "best"}},
        documented_warning=True,  # the second fit finds the default checkpoint's folder not empty, as Lightning warns
    )
    runs = {framework: SimpleNamespace(same_trainer=run(framework, **scenario)) for framework in FRAMEWORKS}
    assert runs["lightning"].same_trainer.counters["fit#2"] == (6, 2)
    assert "M.on_load_checkpoint" in runs["lightning"].same_trainer.hooks["fit#2"]
    assert_same_runs(runs, "same_trainer")


# ---- mid-epoch: a deliberate difference ----------------------------------------------------------------------------


def record_first_input(self, batch, batch_idx):
    """training_step that also records the first input value of its batch, to see which data it was given."""
    self.record("first input", float(batch[0][0, 0]))
    loss = self.loss(batch)
    self.log("train_loss", loss)
    return loss


@pytest.mark.parametrize(
    ("epoch", "batch_idx", "then", "counters"),
    [
        (1, 0, dict(max_epochs=3), (9, 3)),
        (1, 1, dict(max_epochs=3), (9, 3)),
        (0, 0, dict(max_epochs=2), (6, 2)),
        # After the epoch's last batch: Lightning also drops the rest of that epoch (its validation and
        # on_train_epoch_end) and starts the next one; GPUlayer runs them, as the unbroken run did.
        (1, 2, dict(max_epochs=3), (9, 3)),
        (1, 0, dict(max_epochs=3, max_steps=5), (5, 2)),  # stops in the resumed epoch
        (1, 0, dict(max_steps=8), (8, 3)),
    ],
    ids=str,
)
def test_resume_from_the_middle_of_an_epoch(resume, epoch, batch_idx, then, counters):
    """Saved in ``on_train_batch_end`` of (``epoch``, ``batch_idx``); resumed under ``then``.

    DELIBERATE DIFFERENCE (ADR 0008): Lightning restarts a plain DataLoader from its first batch while
    ``batch_idx`` goes on (``_TrainingEpochLoop.reset`` warns that the loader is not resumable), so its resumed
    epoch trains the epoch's *first* batches again under the labels ``batch_idx+1, ...``; GPUlayer resumes
    exactly, with the batches an unbroken run would read next. Weights, metrics, the data each step sees and
    (after an epoch's last batch) the hooks therefore differ by design and are not compared. What must agree, and
    is compared: the final ``global_step`` and ``current_epoch``, that neither framework runs the sanity check,
    and the (epoch, ``batch_idx``, ``global_step``) of every resumed training step.
    """
    scenario = dict(module={"training_step": record_first_input})
    runs = resume(
        dict(scenario, trainer=dict(max_epochs=3)),
        dict(scenario, trainer=then),
        lambda path: saves_at(path, epoch, batch_idx),
    )
    lightning, gpulayer = runs["lightning"].resumed, runs["gpulayer"].resumed
    assert lightning.counters["fit"] == gpulayer.counters["fit"] == counters
    assert sanity_steps(lightning) == sanity_steps(gpulayer) == []
    assert train_calls(lightning) == train_calls(gpulayer)
    step = epoch * BATCHES + batch_idx + 1
    next_batch = (epoch, batch_idx + 1, step) if batch_idx + 1 < BATCHES else (epoch + 1, 0, step)
    assert train_calls(gpulayer)[0] == next_batch

    # The difference itself, pinned so that a change on either side is noticed: the data of the batches
    # trained in the rest of the interrupted epoch.
    rest = min(BATCHES - batch_idx - 1, len(train_calls(gpulayer)))
    epoch_inputs = runs["gpulayer"].saved.extra["first input"][epoch * BATCHES : (epoch + 1) * BATCHES]
    assert gpulayer.extra["first input"][:rest] == epoch_inputs[batch_idx + 1 :][:rest]  # exact: the batches not read
    assert lightning.extra["first input"][:rest] == epoch_inputs[:rest]  # replayed: the epoch's first batches


# ---- after max_steps stopped an epoch: exact here, not in Lightning -----------------------------------------------


def _adamw(module):
    return torch.optim.AdamW(module.parameters(), lr=0.05)


STOPPED = dict(train_size=48, shuffle=True, dropout=0.2, configure_optimizers=_adamw)  # 12 batches an epoch


@pytest.mark.parametrize("then_steps", [12, 18], ids=lambda steps: f"6->{steps}")
@pytest.mark.parametrize(
    ("save", "lightning_epochs_more"),
    [(saves_after_fit, 1), pytest.param(lambda path: saves_at(path, epoch=0), 0, id="saves_at-on_train_epoch_end")],
    ids=lambda value: getattr(value, "__name__", None),
)
def test_a_run_max_steps_stopped_mid_epoch_resumes_to_the_unbroken_weights(
    resume, run, save, lightning_epochs_more, then_steps
):
    """``fit(max_steps=6)`` stops in the middle of a 12-batch shuffled epoch (dropout, AdamW); the checkpoint is
    saved after ``fit`` returned or in the stop's ``on_train_epoch_end`` (where ``ModelCheckpoint`` saves), and a
    new Trainer goes on to ``max_steps=then_steps`` (18 crosses into the next epoch).

    The stop ends the epoch in both trainers (``current_epoch`` is 1 after it). GPUlayer's checkpoint also keeps
    the state at the stop, so its resumed run finishes the interrupted epoch with the rest of that epoch's
    shuffled batches and the RNG states an unbroken run had: it ends with the unbroken run's weights, bit for
    bit, and its counters. Lightning 2.6 reshuffles and reads the epoch's loader from its start while
    ``batch_idx`` goes on at 6 (``_TrainingEpochLoop.reset`` warns that the loader is not resumable), and restores
    no RNG state: it takes the same steps but ends 0.09 (6->12) and 0.21 (6->18) from its unbroken run (max
    |Δw|). From the file saved after ``fit`` it also counts the stopped epoch as done and trains a new one, so it
    ends one epoch further than an unbroken run; from the one saved in ``on_train_epoch_end`` its counters are
    right.
    """
    runs = resume(dict(STOPPED, trainer=dict(max_steps=6)), dict(STOPPED, trainer=dict(max_steps=then_steps)), save)
    unbroken = {framework: run(framework, **STOPPED, trainer=dict(max_steps=then_steps)) for framework in FRAMEWORKS}
    for part in ("saved", "unbroken"):  # up to the stop, and unbroken, GPUlayer is Lightning
        lightning, ours = (getattr(runs[f], part, None) or unbroken[f] for f in FRAMEWORKS)
        torch.testing.assert_close(ours.weights, lightning.weights, msg=part)
        assert ours.counters["fit"] == lightning.counters["fit"], part
    assert runs["gpulayer"].saved.counters["fit"] == (6, 1)

    ours, theirs = runs["gpulayer"].resumed, runs["lightning"].resumed
    epochs = math.ceil(then_steps / 12)  # the stopped epoch counts as done, in both trainers
    torch.testing.assert_close(ours.weights, unbroken["gpulayer"].weights, rtol=0, atol=0)
    assert ours.counters["fit"] == unbroken["gpulayer"].counters["fit"] == (then_steps, epochs)
    assert train_calls(ours) == train_calls(unbroken["gpulayer"])[6:]
    assert sanity_steps(ours) == sanity_steps(theirs) == []

    # Lightning: the same steps; its epochs and weights are pinned, so that a change on its side is noticed.
    assert theirs.counters["fit"] == (then_steps, epochs + lightning_epochs_more)
    assert train_calls(theirs)[0] == (lightning_epochs_more, 6, 6)
    distance = max((theirs.weights[k] - w).abs().max().item() for k, w in unbroken["lightning"].weights.items())
    assert distance > 0.05, distance


def test_a_run_max_steps_stopped_mid_epoch_resumed_under_max_epochs_finishes_the_epoch(resume, run):
    """The file saved after ``fit(max_steps=6)``, resumed with ``max_epochs=1`` and no ``max_steps``: GPUlayer
    finishes the stopped epoch and ends as an unbroken ``max_epochs=1`` run, (12, 1) with its weights. Lightning
    2.6 counts the stopped epoch as done and trains nothing (pinned)."""
    runs = resume(dict(STOPPED, trainer=dict(max_steps=6)), dict(STOPPED, trainer=dict(max_epochs=1)), saves_after_fit)
    unbroken = run("gpulayer", **STOPPED, trainer=dict(max_epochs=1))
    ours = runs["gpulayer"].resumed
    torch.testing.assert_close(ours.weights, unbroken.weights, rtol=0, atol=0)
    assert ours.counters["fit"] == unbroken.counters["fit"] == (12, 1)
    assert runs["lightning"].resumed.counters["fit"] == (6, 1) and train_calls(runs["lightning"].resumed) == []


def test_a_lightning_checkpoint_is_refused_by_fit_naming_it_and_what_loads_it(run, tmp_path):
    """Lightning's ``loops`` entry holds its own loop objects' state: ``fit(ckpt_path=)`` says so, naming the file,
    before anything is restored (it was a bare ``KeyError: 'epochs_processed'``)."""
    path = tmp_path / "lightning.ckpt"
    run("lightning", trainer=dict(max_epochs=1), **saves_after_fit(path))
    with pytest.raises(ValueError, match=r"lightning\.ckpt.*written by another trainer.*load_from_checkpoint"):
        run("gpulayer", trainer=dict(max_epochs=2), stage_arguments={"fit": {"ckpt_path": path}})
