"""omnix's own routes about requests: ``/v1/requests/{id}`` (its state),
``/events``, ``/stream``, ``/cancel``, ``/trace``.  ``protocol`` (bodies),
``views`` (events and states as JSON and SSE), ``router`` (handlers,
table rows, OpenAPI)."""
