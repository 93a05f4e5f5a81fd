import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    """One intra-op thread for the whole test session: the tests use small tensors, and under
    pytest-xdist the workers already use every core (oversubscribed OpenMP threads made some
    modules 5-10x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
