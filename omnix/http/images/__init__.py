"""``POST /v1/images/generations``: ``protocol``, ``plan``, ``render``,
``router``, as in ``omnix.http.chat``."""
