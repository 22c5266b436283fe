"""A ``FlowControl`` (lb/http1.py) and nothing more, for the tests of the parsers and their body streams."""

from __future__ import annotations


class RecordingFlow:
    """Always connected; records the pauses and resumes the body streams ask for, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    @property
    def connected(self) -> bool:
        return True

    def pause_reading(self) -> None:
        self.calls.append("pause")

    def resume_reading(self, resume_parser: bool = True) -> None:
        self.calls.append("resume")
