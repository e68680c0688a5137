"""The two kinds of user error `mmsp prepare` reports (both exit 2)."""


class PrepareError(Exception):
    """Nothing can be prepared: a flag, the model directory, an unreadable input file."""


class BadSample(Exception):
    """One input record is bad. The message names the value and the rule; the caller adds
    `FILE:LINE: ` in front."""
