"""The origin's HTTP surface: the ASGI routing table and request model, the server and its
listeners, error replies, the access log and telemetry."""
