"""Errors that services raise and the API turns into its error body."""


class ConflictError(Exception):
    """A write would break an existing object or rule (409); the message names what conflicts."""

    def __init__(self, message: str, *, attr: str | None = None) -> None:
        super().__init__(message)
        self.attr = attr
