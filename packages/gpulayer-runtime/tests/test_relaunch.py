"""relaunch(): how this script is run again under ``gpulayer launch`` (its path or ``-m`` module, its arguments, and
Lightning's variables for nodes started by hand)."""

import sys
import types

import pytest

from gpulayer.runtime.relaunch import _node_arguments, _this_script


def test_the_script_is_run_again_by_path_or_as_the_module_it_was_started_as(monkeypatch, tmp_path):
    monkeypatch.delenv("PYTEST_CURRENT_TEST")
    script = tmp_path / "train.py"
    script.write_text("")
    monkeypatch.setattr(sys, "argv", [str(script), "--lr", "0.1"])
    main = types.ModuleType("__main__")
    main.__file__, main.__spec__ = str(script), None
    monkeypatch.setitem(sys.modules, "__main__", main)
    assert _this_script(2, "devices=2") == [str(script), "--lr", "0.1"]
    main.__spec__ = types.SimpleNamespace(name="pkg.train")
    assert _this_script(2, "devices=2") == ["-m", "pkg.train", "--lr", "0.1"]
    main.__spec__ = types.SimpleNamespace(name="pkg.__main__")
    assert _this_script(2, "devices=2") == ["-m", "pkg", "--lr", "0.1"]


def test_an_interactive_session_is_refused(monkeypatch):
    monkeypatch.delenv("PYTEST_CURRENT_TEST")
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))
    with pytest.raises(RuntimeError, match=r"devices=2 starts 2 processes .* interactive session"):
        _this_script(2, "devices=2")


def test_several_nodes_by_hand_need_lightnings_variables(monkeypatch):
    for name in ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MASTER_ADDR", "head")
    with pytest.raises(RuntimeError, match="missing: MASTER_PORT, NODE_RANK"):
        _node_arguments(2)
    monkeypatch.setenv("MASTER_PORT", "29400")
    monkeypatch.setenv("NODE_RANK", "1")
    assert _node_arguments(2) == [
        "--nnodes", "2", "--node-rank", "1", "--rdzv-backend", "static", "--rdzv-endpoint", "head:29400",
    ]  # fmt: skip


def test_inside_pytest_it_refuses_to_start_pytest_again_naming_what_asked():
    with pytest.raises(RuntimeError, match="nproc_per_node=3 inside a pytest test would start pytest again"):
        _this_script(3, "nproc_per_node=3")
