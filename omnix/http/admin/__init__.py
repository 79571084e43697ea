"""The server's own routes: ``/health``, ``/ready``, ``/version``,
``/metrics``, ``/start_profile`` and ``/stop_profile``, ``/openapi.json``:
``protocol`` (bodies), ``router`` (handlers, table rows, OpenAPI)."""
