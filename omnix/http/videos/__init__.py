"""``/v1/videos``: video generation as jobs (``protocol``, ``plan``,
``render``, ``router``), as in ``omnix.http.images``."""
