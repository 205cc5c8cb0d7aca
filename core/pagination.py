"""The one pagination style of /api: `?limit=&offset=`, answered as {count, next, previous, results}.

`max_limit` bounds one page, so `?limit=10000000` cannot make a single response load a whole
usage table into memory; the default page is REST_FRAMEWORK["PAGE_SIZE"].
"""

from rest_framework.pagination import LimitOffsetPagination


class Pagination(LimitOffsetPagination):
    max_limit = 1000
