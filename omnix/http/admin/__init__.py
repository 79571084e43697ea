"""The server's own routes: ``/health``, ``/ready``, ``/version``,
``/metrics``, ``/start_profile`` and ``/stop_profile``, ``/openapi.json``:
``protocol`` (bodies), ``router`` (handlers, table rows, OpenAPI); and
``/engines`` (``engines``: what each ready replica's engine runs with);
``/admin/stages/{name}/replicas`` (``replicas``: a scaling stage's count
set by hand)."""
