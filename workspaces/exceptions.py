"""Errors that services raise and the API turns into its error body."""

from django.core.exceptions import ValidationError


class ConflictError(Exception):
    """A write would break an existing object or rule (409); the message names what conflicts."""

    def __init__(self, message: str, *, attr: str | None = None, **extra) -> None:
        super().__init__(message)
        self.attr = attr
        # More of the conflict for the API body (e.g. the quality gate's metric and values).
        self.extra = extra


class ReferenceNotFound(ValidationError):
    """A request names an object (an id or a name in its body or query) that its workspace does
    not have: 404 with ``attr`` naming the field, the same for another workspace's object as for
    one that exists nowhere.

    A ``ValidationError`` of that one field, so that forms, tasks and every caller that refuses
    bad input still show it as a field error; only the API answers it with 404.
    """

    def __init__(self, message: str, *, attr: str) -> None:
        super().__init__({attr: ValidationError(message, code="not_found")})
        self.attr = attr
        self.detail = message
