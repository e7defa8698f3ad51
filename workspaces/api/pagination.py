"""Limit/offset pagination with a hard ceiling on the page size."""

from django.conf import settings
from rest_framework.pagination import LimitOffsetPagination


class CappedLimitOffsetPagination(LimitOffsetPagination):
    """``?limit=&offset=``; a limit above the maximum is cut to the maximum, never run as asked."""

    default_limit = 50
    max_limit = settings.API_MAX_PAGE_SIZE
