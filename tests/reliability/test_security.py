"""Security: an untrusted checkpoint never runs code, through any entry point that loads a file; a single-node
job listens on loopback only, at ports the operating system chose; files GPUlayer creates are not world-writable.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from gpulayer.callbacks import ModelCheckpoint
from gpulayer.runtime.testing import run_command
from gpulayer.trainer import Module, Trainer
from gpulayer.trainer.checkpoint import checkpoint_io
from gpulayer.trainer.checkpoint.checkpoint_io import UnsafeCheckpointError

LISTENING_SCRIPT = Path(__file__).with_name("_listening_script.py")
LOOPBACK = ("127.", "[::1]")


class Regressor(Module):
    def __init__(self, hidden: int = 4):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(2, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))

    def training_step(self, batch, batch_idx):
        loss = self.net(batch[0]).pow(2).mean()
        self.log("loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self.net(batch[0]).pow(2).mean())

    def test_step(self, batch, batch_idx):
        self.log("test_loss", self.net(batch[0]).pow(2).mean())

    def predict_step(self, batch, batch_idx):
        return self.net(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _loader():
    return DataLoader(TensorDataset(torch.randn(8, 2, generator=torch.Generator().manual_seed(0))), batch_size=4)


class _Touch:
    """Unpickled, it creates ``marker``: the stand-in for any code an attacker's checkpoint would run."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.fixture(scope="module")
def good_checkpoint(tmp_path_factory):
    """A checkpoint of a real fit, that every entry point would load."""
    root = tmp_path_factory.mktemp("good")
    trainer = Trainer(accelerator="cpu", default_root_dir=root, max_epochs=1, logger=False, enable_checkpointing=False)
    trainer.fit(Regressor(), _loader())
    trainer.save_checkpoint(root / "good.ckpt")
    return root / "good.ckpt"


def _plant(good: Path, path: Path, marker: Path) -> Path:
    """``good`` with a payload in its hyperparameters, written to ``path``."""
    checkpoint = torch.load(good, weights_only=True)
    checkpoint["hyper_parameters"]["note"] = _Touch(marker)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(checkpoint, path)
    return path


def _trainer(root: Path, **options) -> Trainer:
    return Trainer(accelerator="cpu", default_root_dir=root, max_epochs=2, logger=False, **options)


def _fit(root, path, monkeypatch):
    _trainer(root, enable_checkpointing=False).fit(Regressor(), _loader(), ckpt_path=path)


def _validate(root, path, monkeypatch):
    _trainer(root, enable_checkpointing=False).validate(Regressor(), _loader(), ckpt_path=path)


def _test(root, path, monkeypatch):
    _trainer(root, enable_checkpointing=False).test(Regressor(), _loader(), ckpt_path=path)


def _predict(root, path, monkeypatch):
    _trainer(root, enable_checkpointing=False).predict(Regressor(), _loader(), ckpt_path=path)


def _fit_last(root, path, monkeypatch):
    shutil.move(path, root / "checkpoints" / "last.ckpt")
    trainer = _trainer(root, callbacks=[ModelCheckpoint(dirpath=root / "checkpoints")])
    with _resuming_into_a_full_folder():
        trainer.fit(Regressor(), _loader(), ckpt_path="last")


def _fit_hpc(root, path, monkeypatch):
    shutil.move(path, root / "hpc_ckpt_1.ckpt")
    _trainer(root, enable_checkpointing=False).fit(Regressor(), _loader(), ckpt_path="hpc")


def _fit_restarted(root, path, monkeypatch):
    # A worker the elastic agent restarted resumes from the newest checkpoint it finds, with no ckpt_path.
    trainer = _trainer(root, callbacks=[ModelCheckpoint(dirpath=root / "checkpoints")])
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    with _resuming_into_a_full_folder():
        trainer.fit(Regressor(), _loader())


@contextlib.contextmanager
def _resuming_into_a_full_folder():
    """Resuming writes into the folder that holds the checkpoint: ModelCheckpoint warns, as Lightning's does."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Checkpoint directory .* exists and is not empty", UserWarning)
        yield


def _fit_torch_told_to_trust(root, path, monkeypatch):
    # torch's switch for loads that do not say weights_only: GPUlayer always says it.
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    _trainer(root, enable_checkpointing=False).fit(Regressor(), _loader(), ckpt_path=path)


def _load_from_checkpoint(root, path, monkeypatch):
    Regressor.load_from_checkpoint(path)


def _load_from_checkpoint_weights_only_0(root, path, monkeypatch):
    Regressor.load_from_checkpoint(path, weights_only=0)  # falsy, but not False: not an opt-in


def _checkpoint_io_load(root, path, monkeypatch):
    checkpoint_io.load(path)


ENTRY_POINTS = {
    "Trainer.fit(ckpt_path=...)": _fit,
    "Trainer.validate(ckpt_path=...)": _validate,
    "Trainer.test(ckpt_path=...)": _test,
    "Trainer.predict(ckpt_path=...)": _predict,
    "Trainer.fit(ckpt_path='last')": _fit_last,
    "Trainer.fit(ckpt_path='hpc')": _fit_hpc,
    "Trainer.fit() in a restarted worker": _fit_restarted,
    "Trainer.fit with TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1": _fit_torch_told_to_trust,
    "Module.load_from_checkpoint": _load_from_checkpoint,
    "Module.load_from_checkpoint(weights_only=0)": _load_from_checkpoint_weights_only_0,
    "checkpoint_io.load": _checkpoint_io_load,
}


@pytest.mark.parametrize("entry_point", ENTRY_POINTS)
def test_a_checkpoint_holding_code_is_refused_and_the_code_never_runs(
    outcome, good_checkpoint, tmp_path, monkeypatch, entry_point
):
    marker = tmp_path / "code_ran"
    path = _plant(good_checkpoint, tmp_path / "checkpoints" / "evil.ckpt", marker)
    with pytest.raises(Exception) as raised:
        ENTRY_POINTS[entry_point](tmp_path, path, monkeypatch)
    message = str(raised.value)
    outcome(
        "Security",
        f"untrusted checkpoint via {entry_point}",
        error=type(raised.value).__name__,
        message=message.replace(f"{tmp_path}{os.sep}", "")[:300],
        code_ran=marker.exists(),
        result="refused, naming the offending global and weights_only=False as the opt-in; the payload never ran",
    )
    assert type(raised.value) is UnsafeCheckpointError
    assert message.startswith("refused to load ") and "could run code" in message, message
    assert "load it with weights_only=False" in message, message
    assert not marker.exists()


def test_weights_only_false_is_the_opt_in_and_it_does_run_the_payload(outcome, good_checkpoint, tmp_path):
    """The proof that the payload above is live: a caller who trusts the file opts in, and only then it runs."""
    marker = tmp_path / "code_ran"
    path = _plant(good_checkpoint, tmp_path / "evil.ckpt", marker)
    model = Regressor.load_from_checkpoint(path, weights_only=False)
    outcome(
        "Security",
        "weights_only=False opts in to a trusted file",
        code_ran=marker.exists(),
        result="only the explicit weights_only=False unpickles arbitrary objects (here the payload ran)",
    )
    assert marker.exists() and isinstance(model, Regressor)


def _run_listening_job(out: Path, wrapper: list[str] = ()) -> dict:
    argv = [*wrapper, sys.executable, "-m", "gpulayer.runtime", "launch", "--nproc-per-node", "2"]
    finished = run_command([*argv, str(LISTENING_SCRIPT), str(out)], timeout=60, cwd=out.parent)
    assert finished.returncode == 0, finished.stderr
    seen = json.loads(out.read_text())
    assert seen["agent"] and seen["worker_count"] == 2, seen
    return seen


@pytest.mark.multiprocess
def test_a_single_node_job_listens_on_loopback_only_at_ports_the_os_chose(outcome, tmp_path):
    first, second = (_run_listening_job(tmp_path / f"run{n}.json") for n in (1, 2))
    listening = first["agent"] + first["workers"]
    exposed = [
        address for address in listening + second["agent"] + second["workers"] if not address.startswith(LOOPBACK)
    ]
    outcome(
        "Security",
        "single-node job: loopback only, no fixed port",
        listening=listening,
        second_run=second["agent"] + second["workers"],
        exposed=exposed,
        result="the agent's store and the workers listen on loopback only, at ports that differ between runs",
    )
    assert exposed == []
    assert not set(first["agent"]) & set(second["agent"]), (first, second)


def _host_address() -> str | None:
    """A non-loopback IPv4 address of this machine (from /proc/net/fib_trie), if it has one."""
    try:
        lines = Path("/proc/net/fib_trie").read_text().splitlines()
    except OSError:
        return None
    addresses = [above.split()[-1] for above, line in itertools.pairwise(lines) if "/32 host LOCAL" in line]
    return next((address for address in addresses if not address.startswith("127.")), None)


@pytest.mark.multiprocess
def test_workers_listen_on_loopback_even_where_the_host_name_resolves_to_a_network_address(outcome, tmp_path):
    """As on most cluster nodes and cloud VMs: run in a UTS namespace whose host name is this machine's address."""
    address = _host_address()
    namespace = ["unshare", "--user", "--map-root-user", "--uts"]
    if address is None or shutil.which("unshare") is None or run_command([*namespace, "true"]).returncode != 0:
        pytest.skip("needs a non-loopback address and `unshare --user --uts`")
    wrapper = [*namespace, "sh", "-c", 'hostname "$0" && exec "$@"', address]
    seen = _run_listening_job(tmp_path / "run.json", wrapper)
    exposed = [entry for entry in seen["agent"] + seen["workers"] if not entry.startswith(LOOPBACK)]
    outcome(
        "Security",
        "single-node job on a host whose name resolves to a network address",
        listening=seen["agent"] + seen["workers"],
        exposed=exposed,
        result=f"{len(exposed)} worker socket(s) listen on {address}, reachable from the network"
        if exposed
        else "the agent and the workers listen on loopback only",
    )
    assert exposed == []


@pytest.fixture(scope="module")
def made_under_umask_0(tmp_path_factory):
    """A fit with the CSV logger, ModelCheckpoint and a manual save, with umask 0: each path it made, and its mode."""
    root = tmp_path_factory.mktemp("umask") / "run"
    callback = ModelCheckpoint(monitor="val_loss", save_top_k=2, save_last=True)
    trainer = Trainer(accelerator="cpu", default_root_dir=root, max_epochs=2, log_every_n_steps=1, callbacks=[callback])
    previous = os.umask(0)
    try:
        trainer.fit(Regressor(), _loader(), _loader())
        trainer.save_checkpoint(root / "manual" / "model.ckpt")
    finally:
        os.umask(previous)
    made = {root: root.stat().st_mode}
    made |= {path: path.lstat().st_mode for path in root.rglob("*") if not path.is_symlink()}
    return {str(path.relative_to(root.parent)): mode & 0o777 for path, mode in made.items()}


def _world_writable(made: dict[str, int]) -> list[str]:
    return sorted(path for path, mode in made.items() if mode & 0o002)


def test_checkpoints_and_the_folders_saving_makes_are_not_world_writable_under_umask_0(outcome, made_under_umask_0):
    saved = {
        path: mode
        for path, mode in made_under_umask_0.items()
        if path.endswith(".ckpt") or path.endswith(("/checkpoints", "/manual"))
    }
    outcome(
        "Security",
        "checkpoint files and folders under umask 0",
        modes={path: oct(mode) for path, mode in saved.items()},
        world_writable=_world_writable(saved),
        result="checkpoints are 0o600 and the folders save_atomic makes drop the world-write bit",
    )
    assert len([path for path in saved if path.endswith(".ckpt")]) >= 3, saved
    assert _world_writable(saved) == []


def test_no_file_or_folder_a_fit_makes_is_world_writable_under_umask_0(outcome, made_under_umask_0):
    outcome(
        "Security",
        "every file and folder a fit makes, under umask 0",
        modes={path: oct(mode) for path, mode in made_under_umask_0.items()},
        world_writable=_world_writable(made_under_umask_0),
        result="no file or folder is world-writable: the logger's folders are 0o775, its files 0o664, checkpoints 0o600",
    )
    assert _world_writable(made_under_umask_0) == []
