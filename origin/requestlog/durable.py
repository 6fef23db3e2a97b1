"""The sinks beyond the Redis window that the settings ask for: the durable files
(``PRISM_LOG_DIR`` or ``PRISM_LOG_BUCKET``) and OpenTelemetry logs (an OTLP endpoint).

Each is imported only when configured: boto3 and the OpenTelemetry SDK cost start-up time
and memory an origin without them should not pay.
"""

from __future__ import annotations

from ..settings import Settings
from .files import file_sink
from .sink import RecordSink

__all__ = ["durable_sinks"]


def durable_sinks(settings: Settings) -> list[RecordSink]:
    sinks: list[RecordSink] = []
    files = file_sink(settings)
    if files is not None:
        if settings.log_files_interval is not None:
            files.flush_interval = settings.log_files_interval  # read by its buffer
        sinks.append(files)
    if settings.otel_endpoint:
        from .otlp import OTLPLogSink

        sinks.append(
            OTLPLogSink(settings.otel_endpoint, settings.otel_service_name, settings.release)
        )
    return sinks
