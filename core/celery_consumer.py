"""The worker's broker consumer: Celery's own, surviving the loss of a Redis it held messages of.

Celery 5.7.0 (with kombu 5.7.0) cleans up a lost broker connection in two steps: `collect()`
drops the connection without I/O and detaches it from its transport, then `close()` closes it
again. When the worker holds an unacknowledged message — a task waiting for its countdown, as
every webhook or email retry does, or a task running under acks_late — the first step cannot
finish closing the channel (reading from the dead socket fails), so the second one closes it
once more and asks the detached transport for the broker's address to put the message back:
`AttributeError: 'NoneType' object has no attribute 'hostname'`. Not being a connection error,
it ends the worker ("Unrecoverable error") instead of letting it reconnect. (Celery 5.6.3
only collected; nothing later is released.)

Here that one failure is logged and the consumer reconnects as after any other connection
loss. Nothing is lost by skipping that restore: with the broker down it could not be done
(the message stays in Redis' unacknowledged set, which Redis redelivers after its visibility
timeout), and a retry's state is in the database, whence beat's `send_pending_alerts` sends it
when due (alerts/webhooks.py, alerts/alert_delivery.py).
"""

from __future__ import annotations

import logging

from celery.worker.consumer import Consumer as CeleryConsumer

log = logging.getLogger("capgate.celery")


class Consumer(CeleryConsumer):
    def on_connection_error_after_connected(self, exc: Exception) -> None:
        connection = self.connection
        try:
            super().on_connection_error_after_connected(exc)
        except AttributeError as error:
            # Only the failure described above: Celery has let go of the connection
            # (self.connection is None) after collect() detached it from its transport.
            if self.connection is not None or connection is None or connection._transport is not None:
                raise
            log.warning(
                "broker connection lost with unacknowledged messages; they stay in the broker "
                "(could not restore them through the dropped connection: %r); reconnecting",
                error,
            )
