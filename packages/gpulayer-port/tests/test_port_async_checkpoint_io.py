"""``gpulayer port`` moves Lightning's ``AsyncCheckpointIO`` plugin to the strategy's ``async_save=True`` where the
Trainer call says which strategy, and reports it, naming the edit, where it does not (issue 41)."""

import pytest

from gpulayer.port import registry
from gpulayer.port.async_checkpoint_io import FSDP_NOTE, WRAPPED_NOTE
from gpulayer.port.cli import main
from gpulayer.port.configs import port_config
from gpulayer.port.rewrite import port_code

NOTE = registry.REGISTRY[registry.ASYNC_CHECKPOINT_IO].note


def _plugins_refused(written: str) -> str:
    return registry.refused_trainer_argument("plugins", registry.Written(written))


def _ported(source: str) -> tuple[str, list[str]]:
    """The port's code and findings; porting that code again changes nothing, and finds the same things but the
    Trainer's arguments (the Trainer is GPUlayer's now)."""
    ported = port_code(source)
    again = port_code(ported.code)
    assert again.code == ported.code
    left = [(f.name, f.note) for f in ported.findings if f.name != "Trainer"]
    assert [(f.name, f.note) for f in again.findings] == left
    return ported.code, [finding.format("x.py") for finding in ported.findings]


@pytest.mark.parametrize(
    ("strategy", "plugins", "ported"),
    [
        ('"ddp"', "[AsyncCheckpointIO()]", "DDPStrategy(async_save=True)"),
        ('"DDP"', "AsyncCheckpointIO()", "DDPStrategy(async_save=True)"),  # GPUlayer reads a name in any case
        (
            '"ddp_find_unused_parameters_true"',
            "(AsyncCheckpointIO(),)",
            "DDPStrategy(find_unused_parameters=True, async_save=True)",
        ),
        (
            '"ddp_find_unused_parameters_false"',
            "[AsyncCheckpointIO(TorchCheckpointIO())]",
            "DDPStrategy(async_save=True)",
        ),
        ('"single_device"', "[AsyncCheckpointIO(checkpoint_io=None)]", "SingleDeviceStrategy(async_save=True)"),
        ('"ddp_spawn"', "[AsyncCheckpointIO()]", 'DDPStrategy(start_method="spawn", async_save=True)'),
        (
            '"ddp_notebook_find_unused_parameters_true"',
            "[AsyncCheckpointIO()]",
            'DDPStrategy(find_unused_parameters=True, start_method="fork", async_save=True)',
        ),
    ],
)
def test_a_named_strategy_becomes_gpulayers_with_async_save_and_the_plugin_goes_with_its_import(
    strategy, plugins, ported
):
    """Lightning's default writer inside the plugin (``TorchCheckpointIO()``, ``None``) is GPUlayer's: it goes too."""
    names = "AsyncCheckpointIO, TorchCheckpointIO" if "TorchCheckpointIO" in plugins else "AsyncCheckpointIO"
    source = (
        "import lightning as L\n"
        f"from lightning.pytorch.plugins.io import {names}\n"
        "\n"
        f"trainer = L.Trainer(max_epochs=3, strategy={strategy}, plugins={plugins})\n"
    )
    assert _ported(source) == (
        f"from gpulayer.trainer import {ported.split('(')[0]}, Trainer\n"
        "\n"
        f"trainer = Trainer(max_epochs=3, strategy={ported})\n",
        [],
    )


def test_a_strategy_built_in_the_call_takes_async_save_laid_out_as_its_arguments(tmp_path, capsys):
    source = (
        "import pytorch_lightning as pl\n"
        "from lightning.pytorch import Trainer\n"
        "from lightning.pytorch.plugins import AsyncCheckpointIO\n"
        "from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy\n"
        "\n"
        "ddp = Trainer(\n"
        "    max_epochs=3,\n"
        "    strategy=DDPStrategy(\n"
        "        find_unused_parameters=True,  # a branch is unused\n"
        "    ),\n"
        "    plugins=AsyncCheckpointIO(),  # write behind training\n"
        ")\n"
        'fsdp = Trainer(strategy=FSDPStrategy(state_dict_type="sharded"), plugins=[AsyncCheckpointIO()])\n'
        "one = pl.Trainer(strategy=pl.strategies.SingleDeviceStrategy(), plugins=[pl.plugins.io.AsyncCheckpointIO()])\n"
    )
    expected = (
        "from gpulayer.fsdp import FSDPStrategy\n"
        "from gpulayer.trainer import DDPStrategy, SingleDeviceStrategy, Trainer\n"
        "\n"
        "ddp = Trainer(\n"
        "    max_epochs=3,\n"
        "    strategy=DDPStrategy(\n"
        "        find_unused_parameters=True,  # a branch is unused\n"
        "        async_save=True,\n"
        "    ),\n"
        ")\n"
        'fsdp = Trainer(strategy=FSDPStrategy(state_dict_type="sharded", async_save=True))\n'
        "one = Trainer(strategy=SingleDeviceStrategy(async_save=True))\n"
    )
    assert _ported(source) == (expected, [])
    script = tmp_path / "train.py"
    script.write_text(source)
    assert main([str(script), "--in-place"]) == 0  # nothing left by hand
    assert script.read_text() == expected
    assert capsys.readouterr().out == ""


def test_where_the_call_does_not_say_the_strategy_the_plugin_stays_reported_at_it_naming_the_edit():
    """No strategy, ``"auto"`` or a variable (one device or several is not guessed); FSDP with full checkpoints
    (GPUlayer writes only sharded ones behind training); a CheckpointIO of the user's own inside; a plugin built
    outside the call. The import stays, marked once per note; ``plugins=`` holding only the plugin is not reported
    twice. A call that does say its strategy in the same file is still moved."""
    source = (
        "import lightning as L\n"
        "from lightning.pytorch.plugins.io import AsyncCheckpointIO\n"
        "\n"
        "a = L.Trainer(plugins=[AsyncCheckpointIO()])\n"
        'b = L.Trainer(strategy="auto", plugins=AsyncCheckpointIO())\n'
        "c = L.Trainer(strategy=strategy, plugins=[AsyncCheckpointIO()])\n"
        'd = L.Trainer(strategy="fsdp", plugins=[AsyncCheckpointIO()])\n'
        "e = L.Trainer(strategy=L.pytorch.strategies.FSDPStrategy(), plugins=[AsyncCheckpointIO()])\n"
        'f = L.Trainer(strategy="ddp", plugins=[AsyncCheckpointIO(MyCheckpointIO())])\n'
        "plugins = [AsyncCheckpointIO()]\n"
        "g = L.Trainer(plugins=plugins)\n"
        'h = L.Trainer(strategy="ddp", plugins=[AsyncCheckpointIO()])\n'
    )
    code, findings = _ported(source)
    # Without gpulayer-fsdp installed (nox's isolation session), strategy="fsdp" is reported as missing too.
    why = registry.refused_trainer_argument("strategy", "fsdp")
    fsdp_missing = [f"x.py:7:15: Trainer: {why}"] if why else []
    assert code == (
        "from gpulayer.fsdp import FSDPStrategy\n"
        "from gpulayer.trainer import DDPStrategy, Trainer\n"
        f"# gpulayer port: AsyncCheckpointIO: {NOTE}\n"
        f"# gpulayer port: AsyncCheckpointIO: {FSDP_NOTE}\n"
        f"# gpulayer port: AsyncCheckpointIO: {WRAPPED_NOTE}\n"
        "from lightning.pytorch.plugins.io import AsyncCheckpointIO\n"
        "\n"
        "a = Trainer(plugins=[AsyncCheckpointIO()])\n"
        'b = Trainer(strategy="auto", plugins=AsyncCheckpointIO())\n'
        "c = Trainer(strategy=strategy, plugins=[AsyncCheckpointIO()])\n"
        'd = Trainer(strategy="fsdp", plugins=[AsyncCheckpointIO()])\n'
        "e = Trainer(strategy=FSDPStrategy(), plugins=[AsyncCheckpointIO()])\n"
        'f = Trainer(strategy="ddp", plugins=[AsyncCheckpointIO(MyCheckpointIO())])\n'
        "plugins = [AsyncCheckpointIO()]\n"
        "g = Trainer(plugins=plugins)\n"
        "h = Trainer(strategy=DDPStrategy(async_save=True))\n"
    )
    assert findings == [
        f"x.py:4:24: AsyncCheckpointIO: {NOTE}",
        f"x.py:5:40: AsyncCheckpointIO: {NOTE}",
        f"x.py:6:43: AsyncCheckpointIO: {NOTE}",
        *fsdp_missing,
        f"x.py:7:41: AsyncCheckpointIO: {FSDP_NOTE}",
        f"x.py:8:70: AsyncCheckpointIO: {FSDP_NOTE}",
        f"x.py:9:40: AsyncCheckpointIO: {WRAPPED_NOTE}",
        f"x.py:10:12: AsyncCheckpointIO: {NOTE}",
        f"x.py:11:15: Trainer: {_plugins_refused('plugins')}",
    ]


CLUSTER = "[\n        SlurmPlugin(),  # the cluster's\n    ]"  # what is left of a plugins= list written a line each


def test_other_plugins_stay_and_are_reported_as_before_with_what_is_left_of_plugins():
    source = (
        "from lightning.pytorch import Trainer\n"
        "from lightning.pytorch.plugins.io import AsyncCheckpointIO\n"
        "from my_project import SlurmPlugin\n"
        "\n"
        'a = Trainer(strategy="ddp", plugins=[AsyncCheckpointIO(), SlurmPlugin()])\n'
        'b = Trainer(strategy="ddp", plugins=(SlurmPlugin(), AsyncCheckpointIO()))\n'
        "c = Trainer(\n"
        '    strategy="ddp",\n'
        "    plugins=[\n"
        "        SlurmPlugin(),  # the cluster's\n"
        "        AsyncCheckpointIO(),\n"
        "    ],\n"
        ")\n"
        "d = Trainer(plugins=[AsyncCheckpointIO(), SlurmPlugin()])\n"
    )
    code, findings = _ported(source)
    assert code == (
        "from gpulayer.trainer import DDPStrategy, Trainer\n"
        f"# gpulayer port: AsyncCheckpointIO: {NOTE}\n"
        "from lightning.pytorch.plugins.io import AsyncCheckpointIO\n"
        "from my_project import SlurmPlugin\n"
        "\n"
        "a = Trainer(strategy=DDPStrategy(async_save=True), plugins=[SlurmPlugin()])\n"
        "b = Trainer(strategy=DDPStrategy(async_save=True), plugins=(SlurmPlugin(),))\n"  # still a tuple
        "c = Trainer(\n"
        "    strategy=DDPStrategy(async_save=True),\n"
        "    plugins=[\n"
        "        SlurmPlugin(),  # the cluster's\n"
        "    ],\n"
        ")\n"
        "d = Trainer(plugins=[AsyncCheckpointIO(), SlurmPlugin()])\n"
    )
    assert findings == [
        f"x.py:5:29: Trainer: {_plugins_refused('[SlurmPlugin()]')}",
        f"x.py:6:29: Trainer: {_plugins_refused('(SlurmPlugin(),)')}",
        f"x.py:9:5: Trainer: {_plugins_refused(CLUSTER)}",
        f"x.py:14:13: Trainer: {_plugins_refused('[AsyncCheckpointIO(), SlurmPlugin()]')}",
        f"x.py:14:22: AsyncCheckpointIO: {NOTE}",
    ]


def test_the_strategys_name_is_imported_unless_the_file_gives_it_another_meaning():
    """``DDPStrategy`` bound by Lightning's import (which the port rewrites to GPUlayer's) is used as it is; bound to
    something else, the move is not made and the finding names it."""
    reused = (
        "from lightning.pytorch import Trainer\n"
        "from lightning.pytorch.plugins.io import AsyncCheckpointIO\n"
        "from lightning.pytorch.strategies import DDPStrategy\n"
        "default = DDPStrategy()\n"
        'trainer = Trainer(strategy="ddp", plugins=[AsyncCheckpointIO()])\n'
    )
    assert _ported(reused) == (
        "from gpulayer.trainer import DDPStrategy, Trainer\n"
        "default = DDPStrategy()\n"
        "trainer = Trainer(strategy=DDPStrategy(async_save=True))\n",
        [],
    )
    taken = (
        "from lightning.pytorch import Trainer\n"
        "from lightning.pytorch.plugins.io import AsyncCheckpointIO\n"
        "from my_project import DDPStrategy\n"
        'trainer = Trainer(strategy="ddp", plugins=[AsyncCheckpointIO()])\n'
    )
    code, findings = _ported(taken)
    assert code.endswith('trainer = Trainer(strategy="ddp", plugins=[AsyncCheckpointIO()])\n')
    assert findings == [f"x.py:4:44: AsyncCheckpointIO: {NOTE}"]


def test_every_path_to_the_plugin_has_one_answer_and_a_module_import_goes_with_its_last_use():
    paths = [
        "lightning.pytorch.plugins.io.AsyncCheckpointIO",
        "lightning.pytorch.plugins.AsyncCheckpointIO",
        "lightning.pytorch.plugins.io.async_plugin.AsyncCheckpointIO",
        "pytorch_lightning.plugins.AsyncCheckpointIO",
    ]
    assert {registry.answer(path).status for path in paths} == {registry.ARGUMENT}
    assert registry.answer("lightning.pytorch.plugins.io.TorchCheckpointIO").status == registry.NOT_ADOPTED
    source = (
        "from lightning.pytorch import Trainer\n"
        "from lightning.pytorch.plugins import io\n"
        'trainer = Trainer(strategy="ddp", plugins=[io.AsyncCheckpointIO(io.TorchCheckpointIO())])\n'
    )
    assert _ported(source) == (
        "from gpulayer.trainer import DDPStrategy, Trainer\ntrainer = Trainer(strategy=DDPStrategy(async_save=True))\n",
        [],
    )


def test_a_config_naming_the_plugin_reports_it():
    config = (
        "trainer:\n"
        "  _target_: lightning.pytorch.Trainer\n"
        "  strategy: ddp\n"
        "  plugins:\n"
        "    - _target_: lightning.pytorch.plugins.AsyncCheckpointIO\n"
    )
    ported = port_config(config)
    assert ported.code == config.replace("lightning.pytorch.Trainer", "gpulayer.trainer.Trainer")
    assert [finding.format("c.yaml") for finding in ported.findings] == [
        f"c.yaml:5:17: lightning.pytorch.plugins.AsyncCheckpointIO: {NOTE}"
    ]


def test_an_import_on_lines_of_its_own_goes_whole_and_what_was_above_it_stays():
    source = (
        "from lightning.pytorch import Trainer\n"
        "\n"
        "# checkpoints behind training\n"
        "from lightning.pytorch.plugins.io import AsyncCheckpointIO\n"
        "\n"
        'trainer = Trainer(strategy="ddp", plugins=[AsyncCheckpointIO()])\n'
    )
    assert _ported(source) == (
        "from gpulayer.trainer import DDPStrategy, Trainer\n"
        "\n"
        "# checkpoints behind training\n"
        "\n"
        "trainer = Trainer(strategy=DDPStrategy(async_save=True))\n",
        [],
    )


def test_a_file_an_earlier_port_left_with_the_plugin_is_moved_now_and_the_old_mark_goes():
    """Before issue 41 the port left the plugin in GPUlayer's Trainer call, its import marked with the plugins note:
    porting that file again makes the move; GPUlayer's import line is written again with the strategy in it."""
    plugins = registry.REGISTRY["lightning.pytorch.plugins."].note
    source = (
        "from gpulayer.trainer import Module, Trainer  # noqa: F401\n"
        f"# gpulayer port: AsyncCheckpointIO: {plugins}\n"
        "from lightning.pytorch.plugins.io import AsyncCheckpointIO\n"
        "\n"
        'trainer = Trainer(max_epochs=1, strategy="ddp", plugins=[AsyncCheckpointIO()])\n'
        'sharded = Trainer(strategy="fsdp", plugins=[AsyncCheckpointIO()])\n'
    )
    code, findings = _ported(source.replace('sharded = Trainer(strategy="fsdp", plugins=[AsyncCheckpointIO()])\n', ""))
    assert (code, findings) == (
        "from gpulayer.trainer import DDPStrategy, Module, Trainer  # noqa: F401\n"
        "\n"
        "trainer = Trainer(max_epochs=1, strategy=DDPStrategy(async_save=True))\n",
        [],
    )
    code, findings = _ported(source)  # the plugin stays in one call: its import stays, marked anew
    assert code == (
        "from gpulayer.trainer import DDPStrategy, Module, Trainer  # noqa: F401\n"
        f"# gpulayer port: AsyncCheckpointIO: {plugins}\n"
        f"# gpulayer port: AsyncCheckpointIO: {FSDP_NOTE}\n"
        "from lightning.pytorch.plugins.io import AsyncCheckpointIO\n"
        "\n"
        "trainer = Trainer(max_epochs=1, strategy=DDPStrategy(async_save=True))\n"
        'sharded = Trainer(strategy="fsdp", plugins=[AsyncCheckpointIO()])\n'
    )
    assert findings == [f"x.py:6:45: AsyncCheckpointIO: {FSDP_NOTE}"]


@pytest.mark.parametrize(
    ("written", "ported", "findings"),
    [
        ("async_save=True", "trainer = Trainer(strategy=DDPStrategy(async_save=True))\n", []),
        ("async_save=False", None, [f"x.py:3:68: AsyncCheckpointIO: {NOTE}"]),
    ],
)
def test_a_strategy_already_written_with_async_save_is_left_as_it_is(written, ported, findings):
    """True: the plugin only goes; anything else is the user's to settle."""
    source = (
        "from gpulayer.trainer import DDPStrategy, Trainer\n"
        "from lightning.pytorch.plugins.io import AsyncCheckpointIO\n"
        f"trainer = Trainer(strategy=DDPStrategy({written}), plugins=[AsyncCheckpointIO()])\n"
    )
    code, found = _ported(source)
    assert code.endswith(ported or source.splitlines(keepends=True)[-1])
    assert found == findings
