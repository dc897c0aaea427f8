import os

import pytest
import torch


@pytest.fixture(autouse=True)
def restores_environment_and_process_settings():
    """seed_everything and deterministic=... change process-wide state; each test starts and ends clean."""
    environment = dict(os.environ)
    deterministic = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    benchmark = torch.backends.cudnn.benchmark
    yield
    os.environ.clear()
    os.environ.update(environment)
    torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])
    torch.backends.cudnn.benchmark = benchmark
