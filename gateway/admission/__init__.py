"""Admission sizing: what a request may cost before it is sent. The request's fields and their
types, the worst-case bounds, token counts, subjects (key, end user, tags), routing to targets,
the pre-send limits, the service that authenticates, routes and resolves a request, and the
reservation API."""
