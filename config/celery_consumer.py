"""The workers' message consumer: Celery's, surviving a broker restart it would die of.

Celery 5.7.0 closes the broken connection after collecting it, when the connection to Redis is lost
(``Consumer.on_connection_error_after_connected``; 5.6 only collected it). Collecting frees the
transport (``Transport.client`` = None) but leaves the channel open when closing it failed, which it
does when Redis went away in the middle of a read (``_brpop_read`` raises first). The second close
then tries again to requeue the messages the worker holds unacknowledged, needs the freed transport
to build a Redis pool, and raises ``AttributeError``, which ``ignore_errors`` does not catch: the
worker logs "Unrecoverable error" and stops, with its beat. Measured here: a Redis restart killed the
scheduler worker in about one run in eight under load (tests/faults/test_faults.py), every time the
worker held a message; ``tests/test_celery_consumer.py`` makes it happen every time.

Those messages are not lost by skipping the second close: the broker that held them is gone, and one
that comes back with its data requeues them after the visibility timeout (settings).
"""

import logging

from celery.worker.consumer import Consumer as CeleryConsumer

log = logging.getLogger(__name__)


class Consumer(CeleryConsumer):
    def on_connection_error_after_connected(self, exc):
        connection = self.connection
        if connection is not None:
            close = connection.close

            def close_collected():
                try:
                    close()
                except AttributeError:  # the transport was freed by collect(): nothing left to close
                    log.warning("the lost broker connection was already released; reconnecting")

            connection.close = close_collected  # what Celery calls next, through ignore_errors
        super().on_connection_error_after_connected(exc)
