"""This worker's running agent (set by init_rpc, cleared by shutdown), and the
error torch gives when there is none."""

from __future__ import annotations

from typing import Any

NOT_INITIALIZED = "RPC has not been initialized. Call pycoll.rpc.init_rpc() first."

AGENT: Any = None  # the pycoll.rpc.agent.Agent, while RPC is initialized

# pycoll.rpc.autograd's hook, set when that module is imported:
# ``AUTOGRAD(dest, func, args, kwargs, remote) -> (func, args, kwargs)`` wraps
# a call made inside a distributed autograd context so that the callee runs
# it in the same context (and returns the call unchanged outside one).
AUTOGRAD: Any = None


def current(what: str) -> Any:
    """The running agent.

    Raises:
        RuntimeError: RPC is not initialized (``what`` names the call).
    """
    agent = AGENT
    if agent is None or not agent.running:
        raise RuntimeError(f"{what}: {NOT_INITIALIZED}")
    return agent


def is_initialized() -> bool:
    return AGENT is not None and AGENT.running
