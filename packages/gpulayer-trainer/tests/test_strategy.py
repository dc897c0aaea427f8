"""``trainer.strategy``: the one strategy object, with Lightning's names for what users call on it.

One process is compared with Lightning 2.6's ``SingleDeviceStrategy`` call by call; two gloo ranks check the
collectives' values (``reduce``, ``broadcast``, ``all_gather``, ``barrier``, ``reduce_boolean_decision``) from a
module's hooks, where Lightning users call them.
"""

import pytest
import torch
from torch.distributed import ReduceOp

import gpulayer.trainer as gl
from gpulayer.runtime.testing import run_ranks


def _calls(strategy) -> dict:
    """What a Lightning user's code reads from ``trainer.strategy`` on one process."""
    tensor = torch.tensor([1.0, 2.0])
    integer = torch.tensor([3, 4])
    return {
        "root_device": str(strategy.root_device),
        "is_global_zero": strategy.is_global_zero,
        "world_size": strategy.world_size,
        "global_rank": strategy.global_rank,
        "local_rank": strategy.local_rank,
        "barrier": strategy.barrier(),
        "named_barrier": strategy.barrier("after_setup"),
        "broadcast": strategy.broadcast({"path": "a.ckpt"}),
        "reduce_mean": strategy.reduce(tensor).tolist(),
        "reduce_sum": strategy.reduce(tensor, reduce_op="sum").tolist(),
        "reduce_op": strategy.reduce(tensor, reduce_op=ReduceOp.SUM).tolist(),
        "reduce_int_mean": strategy.reduce(integer).tolist(),
        "reduce_number": strategy.reduce(3.5),
        "all_gather": list(strategy.all_gather(tensor).shape),
        "all_gather_sync_grads": list(strategy.all_gather(tensor, sync_grads=True).shape),
        "decision_all": strategy.reduce_boolean_decision(True),
        "decision_any": strategy.reduce_boolean_decision(False, all=False),
    }


def test_one_process_answers_as_lightnings_single_device_strategy(tmp_path):
    lightning = pytest.importorskip("lightning.pytorch")
    theirs = lightning.Trainer(accelerator="cpu", devices=1, logger=False, default_root_dir=tmp_path)
    ours = gl.Trainer(accelerator="cpu", devices=1, logger=False, default_root_dir=tmp_path)
    assert type(ours.strategy).__name__ == type(theirs.strategy).__name__ == "SingleDeviceStrategy"
    assert isinstance(ours.strategy, gl.Strategy)
    assert _calls(ours.strategy) == _calls(theirs.strategy)
    assert ours.strategy_name == "single_device"


def test_a_ddp_strategy_object_is_the_trainers_strategy(tmp_path):
    strategy = gl.DDPStrategy(find_unused_parameters=True)
    trainer = gl.Trainer(accelerator="cpu", strategy=strategy, devices=1, logger=False, default_root_dir=tmp_path)
    assert trainer.strategy is strategy and isinstance(strategy, gl.Strategy)
    assert (trainer.strategy_name, strategy.world_size, strategy.root_device) == ("ddp", 1, torch.device("cpu"))
    assert isinstance(gl.Trainer(strategy="ddp", devices=1, logger=False).strategy, gl.DDPStrategy)


@pytest.mark.parametrize(
    ("call", "named"),
    [
        (lambda s: s.reduce(torch.ones(1), reduce_op="median"), r"reduce\(reduce_op='median'\): accepted values"),
        (lambda s: s.reduce(torch.ones(1), reduce_op=ReduceOp.PRODUCT), r"reduce\(reduce_op=.*accepted values"),
        (lambda s: s.reduce(torch.ones(1), group=object()), r"reduce\(group=.*accepted values are None"),
        (lambda s: s.all_gather(torch.ones(1), group=object()), r"all_gather\(group=.*accepted values are None"),
    ],
)
def test_what_the_strategy_cannot_do_is_refused_naming_the_argument(call, named):
    with pytest.raises(ValueError, match=named):
        call(gl.Trainer(accelerator="cpu", logger=False).strategy)


def test_a_strategy_not_given_to_a_trainer_says_so():
    with pytest.raises(RuntimeError, match=r"DDPStrategy is not attached to a Trainer yet"):
        gl.DDPStrategy().barrier()


class _CallsTheStrategy(gl.Module):
    """Calls ``self.trainer.strategy`` from the hooks where Lightning users do, and keeps what it answered."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.answers: dict = {}

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return self.layer(x).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def on_train_start(self):
        strategy = self.trainer.strategy
        self.answers["model_is_ddp"] = type(strategy.model).__name__
        self.answers["weights_equal"] = strategy.reduce(self.layer.weight.detach().clone(), reduce_op="max").equal(
            strategy.reduce(self.layer.weight.detach().clone(), reduce_op="min")
        )

    def on_train_end(self):
        strategy, rank = self.trainer.strategy, self.trainer.global_rank
        strategy.barrier("before_answers")
        self.answers |= {
            "root_device": str(strategy.root_device),
            "is_global_zero": strategy.is_global_zero,
            "world_size": strategy.world_size,
            "broadcast": strategy.broadcast(f"from rank {rank}", src=1),
            "reduce_mean": strategy.reduce(torch.tensor([float(rank)])).tolist(),
            "reduce_sum": strategy.reduce(torch.tensor([rank + 1.0]), reduce_op="sum").tolist(),
            "reduce_int_mean": strategy.reduce(torch.tensor([rank + 2])).tolist(),
            "all_gather": strategy.all_gather(torch.tensor([rank, 10 * rank])).tolist(),
            "decision_all": strategy.reduce_boolean_decision(rank == 0),
            "decision_any": strategy.reduce_boolean_decision(rank == 0, all=False),
        }
        gathered_input = torch.tensor([rank + 1.0], requires_grad=True)
        strategy.all_gather(gathered_input, sync_grads=True).sum().backward()
        self.answers["sync_grads"] = gathered_input.grad.tolist()
        self.answers["model_after_fit"] = type(strategy.model).__name__


def _fit_and_ask(runtime) -> dict:
    model = _CallsTheStrategy()
    data = torch.utils.data.TensorDataset(torch.randn(8, 2))
    trainer = gl.Trainer(accelerator="cpu", devices=2, max_steps=2, logger=False, enable_checkpointing=False)
    trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=2))
    return model.answers | {"model_after_stage": type(trainer.strategy.model).__name__}


@pytest.mark.multiprocess
def test_two_ranks_answer_lightnings_calls_from_a_modules_hooks():
    first, second = run_ranks(_fit_and_ask, world_size=2, timeout=120)
    assert first["model_is_ddp"] == second["model_is_ddp"] == "DistributedDataParallel"
    assert first["weights_equal"] and second["weights_equal"]  # DDP started both ranks from rank 0's weights
    for answers, rank in ((first, 0), (second, 1)):
        assert answers["root_device"] == "cpu" and answers["world_size"] == 2
        assert answers["is_global_zero"] is (rank == 0)
        assert answers["broadcast"] == "from rank 1"
        assert answers["reduce_mean"] == [0.5]
        assert answers["reduce_sum"] == [3.0]
        assert answers["reduce_int_mean"] == [2]  # (2 + 3) / 2, truncated into the integer tensor as Lightning does
        assert answers["all_gather"] == [[0, 0], [1, 10]]
        assert answers["decision_all"] is False and answers["decision_any"] is True
        assert answers["sync_grads"] == [2.0]  # each rank's input feeds the sum on both ranks
        assert answers["model_after_fit"] == "DistributedDataParallel"
        assert answers["model_after_stage"] == "_CallsTheStrategy"  # the wrapper is dropped when the stage ends


def test_lightnings_ddp_names_start_their_ranks_as_lightnings_registry_says(tmp_path):
    from lightning.pytorch.strategies import StrategyRegistry

    names = [
        name
        for name in StrategyRegistry.available_strategies()
        if name.startswith("ddp") and "xla" not in name and "sharded" not in name
    ]
    assert {"ddp_spawn", "ddp_fork", "ddp_notebook", "ddp_notebook_find_unused_parameters_true"} <= set(names)
    for name in names:
        lightnings = StrategyRegistry[name]["init_params"]
        strategy = gl.Trainer(
            accelerator="cpu", strategy=name, devices=1, logger=False, default_root_dir=tmp_path
        ).strategy
        assert isinstance(strategy, gl.DDPStrategy), name
        assert strategy.start_method == lightnings.get("start_method", "popen"), name
        assert strategy.find_unused_parameters == lightnings.get("find_unused_parameters", False), name


def test_a_start_method_gpulayer_does_not_adopt_is_refused_naming_the_accepted_ones():
    with pytest.raises(ValueError, match=r"start_method='forkserver'\): accepted values are 'popen', 'spawn', 'fork'"):
        gl.DDPStrategy(start_method="forkserver")


def test_the_caller_of_started_ranks_answers_as_lightnings_before_any_call(tmp_path):
    import lightning.pytorch as L

    answers = []
    for trainer_class in (gl.Trainer, L.Trainer):
        trainer = trainer_class(
            accelerator="cpu", strategy="ddp_fork", devices=2, logger=False, default_root_dir=tmp_path
        )
        answers.append(
            (trainer.world_size, trainer.global_rank, trainer.num_devices, trainer.distributed_sampler_kwargs)
        )
    assert answers[0] == answers[1] == (2, 0, 2, {"num_replicas": 2, "rank": 0})
