"""A fake summarizer that holds its first call until the test lets it go: a host caught inside a model call."""

from __future__ import annotations

import threading

from sidecar.testing import RecordedRequest, Reply
from tests.helpers.hosts import WAIT

ANSWER = "The hint is PLATYPUS-7 [fact-old]."


class Gate:
    """A fake summarizer whose first answer waits until the test opens the gate."""

    def __init__(self) -> None:
        self.arrived = threading.Event()
        self.opened = threading.Event()
        self.count = 0

    def __call__(self, request: RecordedRequest) -> Reply:
        self.count += 1
        if self.count == 1:
            self.arrived.set()
            self.opened.wait(WAIT)
        return Reply(text=ANSWER)
