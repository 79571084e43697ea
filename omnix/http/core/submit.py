"""Admission of a plan, as the HTTP API answers it.

Owns ``admit``: a planned call's prompts checked against the first
stage's context (400 before anything is admitted), the batch limit
(``--max-batch``), then ``Omni.submit_group``, which judges every member
(``validate_request``, the ids in use) and admits them all or none, with
its refusals as the HTTP API answers them: 409 for an id in use, 400 for
a request the pipeline cannot serve, 503 while not serving; the
``Rejected`` events of a call admission refused, for the caller to render.

Does not own the judging itself (``Omni.submit_group`` is its one owner)
nor the response (``live.py``).
"""

from __future__ import annotations

from typing import Final

from omnix.api import DuplicateRequestId, ShuttingDown
from omnix.events.options import API_COMPLETIONS, API_IMAGES, API_SPEECH
from omnix.events.types import Rejected
from omnix.front import Unavailable
from omnix.http.common.plan import Plan
from omnix.http.core.errors import ApiError, from_request_error
from omnix.http.core.respond import durable
from omnix.http.core.server import Server
from omnix.pipelines.plan import RequestError

#: The field of a call's body that sets how many requests it submits.
_BATCH_PARAM: Final = {API_IMAGES: "n", API_COMPLETIONS: "prompt", API_SPEECH: "items"}


async def _check_prompts(server: Server, plan: Plan) -> None:
    """Each distinct prompt fits the first stage's context (400 otherwise)."""
    checked: set[tuple[object, str]] = set()
    for _, spec in plan.specs:
        prompt = (spec.prompt, spec.raw_prompt)
        key = (spec.messages or prompt, repr(spec.stage_params.get(server.tokens.stage)))
        if key not in checked:
            checked.add(key)
            await server.tokens.check(spec)


def _check_batch(server: Server, plan: Plan) -> None:
    n = len(plan.specs)
    most = server.options.max_batch
    if n > most:
        api = plan.specs[0][1].api
        raise ApiError(
            400,
            f"This call would submit {n} requests; this server takes at most "
            f"{most} in one call (omnix serve --max-batch). Split the batch.",
            param=_BATCH_PARAM.get(api, "messages"),
            code="batch_too_large",
        )


async def admit(server: Server, plan: Plan) -> list[Rejected] | None:
    """Admit every member of ``plan``, or none: on a refusal, the recorded
    ``Rejected`` event(s) (one per member of a group refused whole)."""
    await _check_prompts(server, plan)
    omni = server.omni
    if not omni.accepting:
        raise server.not_accepting()
    if not omni.log.available:
        raise server.unavailable("The event log is unreachable (its NATS servers do not answer)")
    _check_batch(server, plan)
    media = [(b.array, b.ref.media_type) for b in plan.blobs]
    try:
        events = await omni.admit(plan.specs, media)
    except Unavailable as exc:
        raise server.unavailable(str(exc).rstrip(".")) from None
    except ShuttingDown:
        raise server.not_accepting() from None
    except DuplicateRequestId as exc:
        rid = exc.request_id
        raise ApiError(
            409,
            f"Request id {rid!r} is already in use on this server (see "
            f"GET /v1/requests/{rid}); nothing was submitted. Send a new X-Request-Id, "
            "or omit it to get a fresh id.",
            param="X-Request-Id",
            code="duplicate_request_id",
        ) from None
    except RequestError as exc:
        raise from_request_error(exc) from None
    if events:
        # What the caller answers with (an id, a refusal) must outlive a crash.
        await durable(omni, max(ev.pos for ev in events))
    rejected = [ev for ev in events if isinstance(ev, Rejected)]
    return rejected or None
