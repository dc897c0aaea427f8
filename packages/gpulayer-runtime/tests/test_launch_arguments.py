"""Bad arguments to launch() and `gpulayer launch` are refused before any process starts."""

import dataclasses
from importlib.metadata import entry_points

import pytest

from gpulayer.runtime import launch
from gpulayer.runtime.cli import COMMANDS_GROUP, main
from gpulayer.runtime.launch import _shutdown_option


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"nproc_per_node": 0}, ValueError, "nproc_per_node=0: expected a whole number of at least 1"),
        ({"nnodes": "two"}, ValueError, "nnodes='two': expected a whole number of at least 1, or 'MIN:MAX'"),
        ({"nnodes": "3:2"}, ValueError, "nnodes='3:2'"),
        ({"nnodes": 2}, ValueError, "nnodes=2 needs rdzv_endpoint='HOST:PORT'"),
        ({"rdzv_backend": "etcd"}, ValueError, "rdzv_backend='etcd': expected one of 'c10d', 'static'"),
        ({"max_restarts": -1}, ValueError, "max_restarts=-1"),
        ({"node_rank": 1}, ValueError, r"node_rank=1: must be in \[0, 1\)"),
        ({"module": True}, ValueError, "module=True needs target to be a module name"),
        ({"rdzv_conf": {"timeout": "soon"}}, ValueError, "rdzv_conf timeout='soon': expected a whole number"),
        ({"rdzv_conf": {"timeout": 0}}, ValueError, "rdzv_conf timeout=0: expected a whole number"),
    ],
)
def test_bad_launch_arguments_are_named(kwargs, error, message):
    with pytest.raises(error, match=message):
        launch(print, **kwargs)


def test_a_missing_script_is_named():
    with pytest.raises(FileNotFoundError, match=r"target=.no_such\.py.: no such script"):
        launch("no_such.py")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["launch", "--nproc-per-node", "zero", "x.py"], "--nproc-per-node 'zero': expected a whole number"),
        (["launch", "--rdzv-conf", "oops", "x.py"], "--rdzv-conf 'oops': expected KEY=VALUE"),
        (["launch", "--standalone", "--nnodes", "2", "x.py"], "--standalone is for one node"),
        (["launch", "--rdzv-backend", "etcd", "x.py"], "invalid choice: 'etcd'"),
        (["launch", "missing_script.py"], "target='missing_script.py': no such script"),
    ],
)
def test_bad_cli_arguments_exit_2_with_the_reason(capsys, argv, message):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_env_prints_placement_torch_backends_and_devices(capsys):
    assert main(["env"]) == 0
    printed = capsys.readouterr().out
    for key in ("gpulayer-runtime", "torch", "placement", "backends", "cuda"):
        assert f"\n{key} " in f"\n{printed}"
    assert "from in-process" in printed and "gloo" in printed


def test_help_lists_the_commands_installed_distributions_add_and_refuses_unknown_ones(capsys):
    added = sorted(point.name for point in entry_points(group=COMMANDS_GROUP))  # plot, with gpulayer-trainer
    with pytest.raises(SystemExit):
        main(["--help"])
    listed = capsys.readouterr().out
    assert all(f"gpulayer {name} --help" in listed for name in added)
    with pytest.raises(SystemExit) as exited:
        main(["no-such-command"])
    assert exited.value.code == 2
    assert "invalid choice: 'no-such-command' (choose from 'launch', 'env'" in capsys.readouterr().err


def test_shutdown_timeout_reaches_torchs_launch_config_only_when_given():
    from torch.distributed.launcher.api import LaunchConfig

    @dataclasses.dataclass
    class ConfigWithoutShutdownTimeout:  # the fields torch 2.11's LaunchConfig has, in short
        min_nodes: int
        max_nodes: int

    assert _shutdown_option(LaunchConfig, None) == _shutdown_option(ConfigWithoutShutdownTimeout, None) == {}
    assert _shutdown_option(LaunchConfig, 2.5) == {"shutdown_timeout": 2}
    with pytest.raises(ValueError, match=r"shutdown_timeout=5: torch .*'s elastic agent has no shutdown timeout"):
        _shutdown_option(ConfigWithoutShutdownTimeout, 5)
