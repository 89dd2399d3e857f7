"""examples/torch_ddp.py: loss falls and every rank ends with the same weights."""

from __future__ import annotations

import importlib.util
import os

import pytest

import pycoll

pytest.importorskip("torch")
EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "torch_ddp.py")


def load_example():
    spec = importlib.util.spec_from_file_location("torch_ddp", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_ddp_example_trains_with_identical_weights(tdist, world_size):
    result = load_example().train(steps=150)
    loss = result["loss"]
    assert loss[-1] < loss[0] / 20, (loss[0], loss[-1])
    everyone = [None] * world_size
    pycoll.all_gather_object(everyone, result["weights"])
    assert all(w == everyone[0] for w in everyone)
