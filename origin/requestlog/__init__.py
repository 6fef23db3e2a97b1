"""The request log: one record per request, buffered and fanned out to sinks."""
