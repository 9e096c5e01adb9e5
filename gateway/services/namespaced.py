"""Things remembered per host connection, capped per namespace (HTTP token): the oldest of a namespace is
forgotten first, so one tenant opening many sessions never pushes another's out."""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

T = TypeVar("T")


class PerNamespace(Generic[T]):
    """key -> value, at most `cap` keys per namespace, each namespace's oldest (least recently put or
    touched) forgotten first."""

    def __init__(self, cap: int):
        self.cap = cap
        self.by_namespace: dict[str, OrderedDict[str, T]] = {}  # namespace -> key -> value, oldest first
        self.namespace: dict[str, str] = {}  # key -> its namespace

    def put(self, namespace: str, key: str, value: T) -> None:
        """`key` kept as its namespace's most recent (moved there when it was filed under another)."""
        if self.namespace.get(key, namespace) != namespace:
            self.pop(key)
        held = self.by_namespace.setdefault(namespace, OrderedDict())
        held[key] = value
        held.move_to_end(key)
        self.namespace[key] = namespace
        while len(held) > self.cap:
            self.namespace.pop(held.popitem(last=False)[0], None)

    def get(self, key: str) -> T | None:
        return self.by_namespace.get(self.namespace.get(key, ""), {}).get(key)

    def touch(self, key: str) -> T | None:
        """The value of `key`, kept among its namespace's most recent; None when not remembered."""
        held = self.by_namespace.get(self.namespace.get(key, ""))
        if held is None or key not in held:
            return None
        held.move_to_end(key)
        return held[key]

    def pop(self, key: str) -> None:
        self.by_namespace.get(self.namespace.pop(key, ""), {}).pop(key, None)

    def items(self, namespace: str | None = None) -> list[tuple[str, T]]:
        """(key, value) of one namespace, or of all."""
        spaces = list(self.by_namespace) if namespace is None else [namespace]
        return [item for space in spaces for item in self.by_namespace.get(space, {}).items()]

    def values(self, namespace: str | None = None) -> list[T]:
        return [value for _, value in self.items(namespace)]
