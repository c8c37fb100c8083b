"""Errors raised by the analyzer.

::

    AnalyzerError                      base of everything the analyzer raises on bad input
    ├── InputFileError(ValueError)     a file the user gave is malformed: names file, line, field
    │   ├── SpanFileError              ... a spans file (OTLP JSON lines)
    │   ├── GraphFileError             ... a graphs file written by ``perfcast graph``
    │   ├── ModelFileError             ... an MVA model (TOML) or load-test file
    │   └── ScenarioFileError          ... a scenario TOML file
    ├── GraphError(ValueError)         a graph that cannot be evaluated (a cycle, a dangling edge)
    ├── ScenarioError(ValueError)      a scenario that does not apply (unknown resource, bad value)
    ├── ProfileError(LookupError)      a profile that does not exist or cannot be used
    └── ModelError(ValueError)         an MVA model that is not solvable (negative demand, U > 100%, ...)

The CLI catches ``AnalyzerError``, prints ``Name: message`` and exits with status 1.
"""

from __future__ import annotations

from pathlib import Path


class AnalyzerError(Exception):
    """Base class: bad input to the analyzer, explained in the message."""


class InputFileError(AnalyzerError, ValueError):
    """A user-supplied file is malformed at a known place.

    The message reads ``path:line: field 'name': problem`` (line and field are left out when unknown).
    """

    def __init__(self, path: str | Path, line: int | None, field: str | None, problem: str) -> None:
        self.path = str(path)
        self.line = line
        self.field = field
        self.problem = problem
        where = self.path if line is None else f"{self.path}:{line}"
        what = f"field '{field}': {problem}" if field else problem
        super().__init__(f"{where}: {what}")

    @classmethod
    def read_text(cls, path: str | Path) -> str:
        """The file's text (UTF-8); an unreadable file raises this error class naming it and why."""
        try:
            return Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise cls(path, None, None, f"cannot read: {exc.strerror or exc}") from None


class SpanFileError(InputFileError):
    """A spans file (OTLP JSON lines) has a malformed line, span or attribute."""


class GraphFileError(InputFileError):
    """A graphs file is not in the format ``perfcast graph`` writes."""


class ModelFileError(InputFileError):
    """An MVA model file or a load-test result file is malformed."""


class ScenarioFileError(InputFileError):
    """A scenario file is malformed."""


class GraphError(AnalyzerError, ValueError):
    """A causal graph is not a DAG from ``start`` to ``end``, or refers to nodes it does not have."""


class ScenarioError(AnalyzerError, ValueError):
    """A scenario names a resource the graphs do not have, or a value that makes no sense."""


class ProfileError(AnalyzerError, LookupError):
    """A profile was asked for that the profile store does not have, or it cannot serve the request."""


class ModelError(AnalyzerError, ValueError):
    """A queueing model is invalid: the message names the station and field."""
