"""Error classes, each with its own exit code (listed in the README)."""

from __future__ import annotations


class FixpackError(Exception):
    """Base class. ``exit_code`` is what the CLI returns; the message says what to do."""

    exit_code = 1
    label = "error"


class ConfigError(FixpackError):
    """A fix, profile, port or recipe file is malformed, or names something unknown."""

    exit_code = 2
    label = "configuration error"


class BaseMismatch(FixpackError):
    """The installed files are not the release (or fixed state) the profile pins."""

    exit_code = 3
    label = "base mismatch"


class FixFailed(FixpackError):
    """A fix did not apply, crashed, timed out, touched undeclared files or missed its pin."""

    exit_code = 4
    label = "fix failed"


class Drift(FixpackError):
    """Verify found files that are neither pristine nor the recorded fixed state."""

    exit_code = 5
    label = "drift"


class EnvironmentFault(FixpackError):
    """The file system refused: permission, read-only, full disk, a target that is not a file."""

    exit_code = 6
    label = "environment error"


class Locked(FixpackError):
    """Another fixpack run held the lock longer than the wait allowed."""

    exit_code = 7
    label = "locked"


class SourceUnavailable(FixpackError):
    """A release source (wheel, git commit, cache) cannot be reached or is corrupt."""

    exit_code = 8
    label = "source unavailable"


class CheckFailed(FixpackError):
    """The release check found a fix that is not proven (red/green, pins, revert)."""

    exit_code = 9
    label = "check failed"
