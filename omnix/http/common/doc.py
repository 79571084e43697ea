"""The building blocks of the routes' OpenAPI descriptions.

Owns: references to schemas (``ref``), JSON and event-stream responses
(``json_body``, ``sse``), the operations of a generation route (``post``:
its body, ``X-Request-Id``, the errors every generation may answer) and
of a GET (``get``), the path and event-id parameters, nullable values,
and the schemas a pipeline narrows: ``sampling_params_list`` with each
stage's parameters (the extras its engine cannot honour: null only) and
the ranges ``validate_request`` enforces on them.

Streamed bodies (SSE, raw audio) are described in prose: OpenAPI has no
way to type an event stream.  Does not own any route's description (each
room's ``router.py``) nor the document (``omnix.http.openapi``).
"""

from __future__ import annotations

from typing import Any, Final

from omnix.http.common.sampling import DIFFUSION_PARAMS, ENGINE_PARAMS, EXTRA_PARAMS
from omnix.http.core.errors import ErrorBody
from omnix.pipelines.config import PipelineConfig, engine_kind


def ref(t: type | str) -> dict[str, str]:
    name = t if isinstance(t, str) else t.__name__
    return {"$ref": f"#/components/schemas/{name}"}


def sse(data: dict[str, Any] | None = None, *, done: bool = False) -> dict[str, Any]:
    """``text/event-stream`` whose events' ``data`` is JSON of schema
    ``data`` (OpenAPI before 3.2: ``schema`` describes one event);
    ``done``: the last event's data is ``[DONE]``."""
    field: dict[str, Any] = {"type": "string"}
    if data is not None:
        field |= {"contentMediaType": "application/json", "contentSchema": data}
    if done:
        field = {"anyOf": [{"const": "[DONE]"}, field]}
    return {
        "schema": {
            "type": "object",
            "properties": {
                "id": {"type": "string"},
                "event": {"type": "string"},
                "data": field,
            },
        }
    }


def json_body(t: type, description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": ref(t)}}}


ERRORS: Final = {
    "400": json_body(
        ErrorBody,
        "Invalid request (bad JSON, wrong type, unknown field, out of range, a parameter or "
        "input this pipeline does not take, a batch over the limit, a bad X-Request-Id)",
    ),
    "403": json_body(ErrorBody, "A browser origin the server does not allow (--allowed-origins)"),
    "404": json_body(ErrorBody, "Unknown model"),
    "409": json_body(ErrorBody, "The X-Request-Id is already in use"),
    "413": json_body(ErrorBody, "Body larger than the server's limit"),
    "415": json_body(ErrorBody, "The body was not sent as Content-Type: application/json"),
    "429": json_body(ErrorBody, "Overloaded: retry after Retry-After seconds"),
    "500": json_body(ErrorBody, "The request failed in a stage"),
    "503": json_body(ErrorBody, "Not ready, or shutting down: retry after Retry-After seconds"),
    "504": json_body(ErrorBody, "A stage timed out"),
}
UNAUTHORIZED: Final = json_body(ErrorBody, "Missing or wrong API key")
NOT_FOUND: Final = json_body(ErrorBody, "No such request")
_RID = {
    "X-Request-Id": {
        "description": "The omnix request id(s), comma-separated for a batch",
        "schema": {"type": "string"},
    }
}
_CLIENT_RID = {
    "name": "X-Request-Id",
    "in": "header",
    "required": False,
    "description": "Names the request (a batch's members get -0, -1...); must not be in use",
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._:\\-]{0,127}$"},
}
ID_PARAM: Final = {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}
#: A log position (``/events``), and an SSE event id of a response (``POS``
#: or ``POS.N``, ``/stream``).
POSITION: Final = {"type": "string", "pattern": "^[0-9]{1,18}$"}
EVENT_ID: Final = {"type": "string", "pattern": "^[0-9]{1,18}([.][0-9]{1,4})?$"}


def post(summary: str, body: type, ok: dict[str, Any], description: str = "") -> dict[str, Any]:
    """A generation route's operation."""
    return {
        "summary": summary,
        "description": description,
        "parameters": [_CLIENT_RID],
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": ref(body)}},
        },
        "responses": {"200": {**ok, "headers": _RID}, **ERRORS},
    }


def get(
    summary: str,
    ok: dict[str, Any],
    *,
    params: list[dict[str, Any]] | None = None,
    errors: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A GET operation; ``errors`` are its responses by status code."""
    op: dict[str, Any] = {"summary": summary, "responses": {"200": ok, **(errors or {})}}
    if params:
        op["parameters"] = params
    return op


# -- schemas narrowed to the pipeline -------------------------------------------

NULL: Final = {"type": "null"}


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, NULL], "default": None}


def model_enum(pipeline: PipelineConfig) -> dict[str, Any]:
    """``model``: the pipeline's name, or omitted."""
    return {"enum": ["", pipeline.name], "default": ""}


#: The ranges ``validate_request`` enforces on a stage's parameters.
STAGE_PARAM_RANGES: Final[dict[str, dict[str, Any]]] = {
    "temperature": {"type": "number", "minimum": 0.0, "maximum": 2.0},
    "top_p": {"type": "number", "exclusiveMinimum": 0.0, "maximum": 1.0},
    "top_k": {"type": "integer", "minimum": -1, "maximum": 2**31 - 1},
    "max_tokens": {"type": "integer", "minimum": 1, "maximum": 1_000_000},
    "seed": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
    "num_inference_steps": {"type": "integer", "minimum": 1, "maximum": 1000},
    "width": {"type": "integer", "minimum": 8, "maximum": 4096, "multipleOf": 8},
    "height": {"type": "integer", "minimum": 8, "maximum": 4096, "multipleOf": 8},
    "speed": {"type": "number", "minimum": 0.25, "maximum": 4.0},
    # schema v5 extras
    "min_tokens": {"type": "integer", "minimum": 0, "maximum": 1_000_000},
    "min_p": {"type": "number", "minimum": 0.0, "maximum": 1.0},
    "repetition_penalty": {"type": "number", "exclusiveMinimum": 0.0, "maximum": 10.0},
    "frequency_penalty": {"type": "number", "minimum": -2.0, "maximum": 2.0},
    "presence_penalty": {"type": "number", "minimum": -2.0, "maximum": 2.0},
    "stop_token_ids": {
        "type": "array",
        "items": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1},
        "maxItems": 64,
    },
    "logit_bias": {
        "type": "object",
        "propertyNames": {"pattern": "^[0-9]{1,9}$"},
        "additionalProperties": {"type": "number", "minimum": -100.0, "maximum": 100.0},
        "maxProperties": 300,
    },
    "logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
    # schema v7 (diffusion)
    "strength": {"type": "number", "exclusiveMinimum": 0.0, "maximum": 1.0},
    "partial_images": {"type": "integer", "minimum": 0, "maximum": 3},
    "num_frames": {"type": "integer", "minimum": 1, "maximum": 10000},
    "fps": {"type": "integer", "minimum": 1, "maximum": 120},
    # JSON text of a JSON Schema object
    "json_schema": {"type": "string", "pattern": "^\\s*[{]"},
}


def cannot(pipeline: PipelineConfig, stage: str) -> list[str]:
    """The ``StageParams`` extras the stage's engine cannot honour."""
    kinds = {st.name: engine_kind(st.engine) for st in pipeline.stages}
    can = ENGINE_PARAMS.get(kinds.get(stage, ""), frozenset())
    off = [f for f in EXTRA_PARAMS if f not in can]
    if kinds.get(stage) != "diffusers" and "diffusers" in kinds.values():
        # sampling.DIFFUSION_PARAMS: diffusers stages only (a pipeline
        # without one nulls them in StageParams itself: shape_stage_params)
        off += DIFFUSION_PARAMS
    return off


def _stage_params(pipeline: PipelineConfig, stage: str) -> dict[str, Any]:
    off = cannot(pipeline, stage)
    if not off:
        return ref("StageParams")
    return {"allOf": [ref("StageParams"), {"properties": {f: {"type": "null"} for f in off}}]}


def _unique(schemas: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for sc in schemas:
        if sc not in out:
            out.append(sc)
    return out


def sampling_params_list(pipeline: PipelineConfig) -> dict[str, Any]:
    """A list aligned with the stages, or a map from stage name."""
    stages = [st.name for st in pipeline.stages]
    per = {s: _stage_params(pipeline, s) for s in stages}
    return nullable(
        {
            "anyOf": [
                {
                    "type": "array",
                    "items": {"anyOf": [*_unique(per.values()), NULL]},
                    "minItems": len(stages),
                    "maxItems": len(stages),
                },
                {
                    "type": "object",
                    "properties": per,
                    "additionalProperties": False,
                },
            ]
        }
    )


def shape_stage_params(schemas: dict[str, Any], pipeline: PipelineConfig) -> None:
    """``StageParams`` as ``validate_request`` and the engines take it:
    its ranges; the diffusion fields null on a pipeline without a
    diffusers stage; ``speed`` 1 (no engine honours a speaking rate, on
    any route: ``sampling.SPEECH_ENGINE_PARAMS``)."""
    params = schemas["StageParams"]["properties"]
    for name, rng in STAGE_PARAM_RANGES.items():
        params[name] = nullable(rng)
    if not any(engine_kind(st.engine) == "diffusers" for st in pipeline.stages):
        for field in DIFFUSION_PARAMS:
            params[field] = {"type": "null", "default": None}
    params["speed"] = nullable({"const": 1.0})
