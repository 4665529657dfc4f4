"""Reducing and aggregating states: a value per key that folds what is added to it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from ..errors import StateError
from ..keys.values import RowCodec
from .host import StateHost
from .value import ValueState

__all__ = ["ReducingState", "AggregatingState", "AggregateFunction"]


@runtime_checkable
class AggregateFunction(Protocol):
    """What :meth:`KeyedStateBackend.aggregating_state` folds values with.

    The accumulator is a tuple of the declared accumulator schema; it is what is stored.
    """

    def create_accumulator(self) -> Any:
        """A fresh accumulator (a tuple of the accumulator schema)."""

    def add(self, value: Any, accumulator: Any) -> Any:
        """The accumulator after adding ``value`` (may return a new tuple)."""

    def get_result(self, accumulator: Any) -> Any:
        """What :meth:`AggregatingState.get` returns for ``accumulator``."""


class ReducingState(ValueState):
    """A value per key combined with ``reduce_fn(current, added)`` on :meth:`add`."""

    kind = "reducing"

    def __init__(self, backend: StateHost, name: str, codec: RowCodec,
                 reduce_fn: Callable[[Any, Any], Any], ttl_ms: int | None = None) -> None:
        super().__init__(backend, name, codec, ttl_ms)
        self.reduce_fn = reduce_fn

    def add(self, value: Any) -> None:
        """Fold ``value`` into the current key's value (store it when there is none)."""
        current = self.get()
        self.update(value if current is None else self.reduce_fn(current, value))


class AggregatingState(ValueState):
    """An accumulator per key: :meth:`add` folds values in, :meth:`get` returns the result."""

    kind = "aggregating"

    def __init__(self, backend: StateHost, name: str, codec: RowCodec,
                 aggregate_fn: AggregateFunction, ttl_ms: int | None = None) -> None:
        if not isinstance(aggregate_fn, AggregateFunction):
            raise StateError(f"aggregating state {name!r}: aggregate_fn needs "
                             f"create_accumulator(), add(value, acc) and get_result(acc)")
        super().__init__(backend, name, codec, ttl_ms)
        self.aggregate_fn = aggregate_fn

    def add(self, value: Any) -> None:
        """Fold ``value`` into the current key's accumulator."""
        acc = super().get()
        if acc is None:
            acc = self.aggregate_fn.create_accumulator()
        self.update(self.aggregate_fn.add(value, acc))

    def get(self) -> Any:  # type: ignore[override]
        """``get_result`` of the current key's accumulator, or None when nothing was added."""
        acc = super().get()
        return None if acc is None else self.aggregate_fn.get_result(acc)

    def get_accumulator(self) -> tuple[Any, ...] | None:
        """The stored accumulator of the current key."""
        return super().get()
