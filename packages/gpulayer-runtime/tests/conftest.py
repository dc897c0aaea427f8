import os

import pytest
import torch.distributed as dist


@pytest.fixture(autouse=True)
def leaves_no_process_group_or_environment_behind():
    before = _environment()
    yield
    assert not dist.is_initialized(), "the test left a process group behind"
    assert _environment() == before, "the test changed the environment"


def _environment():
    return {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
