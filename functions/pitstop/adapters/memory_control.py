"""The runtime control in memory (core/control.ControlStore), for tests, replay and the simulator:
a lock stands for the transaction, documents are copied in and out as Firestore copies them."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable

from pitstop.core.control import Change, Control, ControlDoc


class MemoryControl:
    def __init__(self) -> None:
        self.doc: ControlDoc | None = None
        self.changes: list[Change] = []
        self.reads = 0
        self._lock = threading.Lock()

    def read_control(self) -> object:
        with self._lock:
            self.reads += 1
            return copy.deepcopy(self.doc)

    def change_control(self, change: Callable[[ControlDoc], tuple[ControlDoc, Change]]) -> Change:
        with self._lock:
            doc, record = change(Control.of(copy.deepcopy(self.doc)).doc)
            self.doc = copy.deepcopy(doc)
            self.changes.append(copy.deepcopy(record))
            return record

    def control_changes(self, since: float) -> list[Change]:
        with self._lock:
            return [copy.deepcopy(c) for c in self.changes if c["at"] >= since]
