"""Upstream I/O: the proxy call (ProxyCall), streams, the guarded HTTP transport, the threads
that talk to the database, the process runtime, the usage recorder, stored responses and their
continuation context."""
