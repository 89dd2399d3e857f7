"""``async_execution``: a function served by RPC that returns a Future.

As torch.distributed.rpc.functions.async_execution: the worker serving the
call runs the function, which returns at once with a Future (for example
one from its own ``rpc_async``, chained with ``then``), and replies with the
Future's value when it completes. No worker thread waits meanwhile, so
chains of calls through one worker do not use up its threads.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["async_execution"]


def async_execution(fn: F) -> F:
    """Mark ``fn`` as returning a Future whose value is the call's result.

    With ``@staticmethod`` or ``@classmethod``, put this decorator inside.
    A Future may be pycoll's, torch's, or a ``concurrent.futures.Future``.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    wrapper._pycoll_async_execution = True  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]


def is_async(fn: Any) -> bool:
    """True for a function marked by this decorator or by torch's."""
    return bool(
        getattr(fn, "_pycoll_async_execution", False)
        or getattr(fn, "_wrapped_async_rpc_function", None) is not None
    )


def when_done(future: Any, callback: Callable[[Any, BaseException | None], None]) -> None:
    """Call ``callback(value, error)`` once ``future`` completes.

    Raises:
        TypeError: ``future`` is not a Future.
    """
    if not hasattr(future, "add_done_callback"):
        raise TypeError(
            f"an @async_execution function must return a Future, not {type(future).__name__}"
        )

    def done(f: Any) -> None:
        try:
            value = f.value() if hasattr(f, "value") else f.result()
        except BaseException as exc:
            callback(None, exc)
        else:
            callback(value, None)

    future.add_done_callback(done)
