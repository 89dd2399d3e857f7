"""Backend-config strings, as torch's test_backend_config checks them (with
pycoll's backends: mpi everywhere, nccl for cuda)."""

import pytest

from pycoll.gpu import BackendConfig

# Any size of job: the device layer stages or hands over arrays alike (the host
# paths it reaches are tested at every size).
pytestmark = pytest.mark.any_size


@pytest.mark.parametrize(
    "text,expected",
    [
        ("mpi", "cpu:mpi,cuda:mpi"),
        ("MPI", "cpu:mpi,cuda:mpi"),
        ("nccl", "cuda:nccl"),
        ("cpu:mpi,cuda:mpi", "cpu:mpi,cuda:mpi"),
        ("cpu:mpi,cuda:nccl", "cpu:mpi,cuda:nccl"),
        ("cuda:nccl,cpu:mpi", "cuda:nccl,cpu:mpi"),
        (" cpu:mpi , cuda:nccl ", "cpu:mpi,cuda:nccl"),
        ("cpu:mpi", "cpu:mpi"),
    ],
)
def test_valid_strings(text, expected):
    config = BackendConfig(text)
    assert str(config) == expected
    assert config.get_device_backend_map() == dict(p.split(":") for p in expected.split(","))


@pytest.mark.parametrize(
    "text,message",
    [
        ("cpu:mpi,cuda:nccl,", "empty entry"),  # trailing comma, as in torch's test
        ("cpu:mpi,cuda:nccl,cpu:mpi", "given twice"),  # duplicate device, as in torch's test
        ("gloo", "unknown backend 'gloo'"),
        ("cpu:nccl", "cannot serve cpu"),
        ("tpu:mpi", "unknown device 'tpu'"),
        ("cpu:", "must be 'device:backend'"),
        ("cpu", "unknown backend 'cpu'"),
    ],
)
def test_invalid_strings(text, message):
    with pytest.raises(ValueError, match=message):
        BackendConfig(text)


def test_not_a_string():
    with pytest.raises(TypeError, match="backend must be a string"):
        BackendConfig(None)
