"""The gateway's HTTP side: the ASGI entry (app), the route table, the request and response
helpers (request), the error shapes (errors), the probes (ops) and the Prometheus metrics."""
