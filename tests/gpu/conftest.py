"""GPU tests: marked ``gpu`` and skipped where torch sees no CUDA/ROCm device."""

from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="needs a CUDA or ROCm device (run by ci/gpu.sh on a GPU machine)")
    for item in items:
        if HERE not in Path(item.path).resolve().parents:
            continue  # this hook sees the whole session: touch only tests/gpu
        item.add_marker(pytest.mark.gpu)
        if not torch.cuda.is_available():
            item.add_marker(skip)
