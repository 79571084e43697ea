"""The playground: a page in the browser served by the server itself (``router.py``)."""
