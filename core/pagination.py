"""The one pagination style of /api: `?limit=&offset=`, answered as {count, next, previous, results}.

`max_limit` bounds one page, so `?limit=10000000` cannot make a single response load a whole
usage table into memory; the default page is REST_FRAMEWORK["PAGE_SIZE"].

`limit` and `offset` are ASCII digits (core/strict.py): DRF reads them with int(), which also
takes "1_000" and other scripts' digits ("١" is 1). Anything else is ignored, as DRF ignores a
value that is not a number: the default page.
"""

from typing import Any

from rest_framework.pagination import LimitOffsetPagination

from core.strict import ascii_int


class Pagination(LimitOffsetPagination):
    max_limit = 1000

    def get_limit(self, request: Any) -> int | None:
        if ascii_int(request.query_params.get(self.limit_query_param, "0")) is None:
            return self.default_limit
        return super().get_limit(request)

    def get_offset(self, request: Any) -> int:
        if ascii_int(request.query_params.get(self.offset_query_param, "0")) is None:
            return 0
        return super().get_offset(request)
