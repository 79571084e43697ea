"""A trace shown to a person: as text (``show.py``: the timeline, the
waterfall, each event described) and as one HTML page (``html.py``).

Below the HTTP layer, which serves a request's page, and replay, whose
``omnix replay`` prints and writes them; owns no replaying.
"""
