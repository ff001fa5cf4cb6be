"""The live server's OpenAPI schema: every operation documented and listed once, every `$ref` resolving, every example
valid for the model it illustrates (POST /sweeps' examples also plan), and schemathesis' generated requests (with a
write token) to every operation never producing a 5xx, some of them valid specs that reach the planner and the
store. Bounded: a few examples per operation, one worker, no background loops (nothing trains)."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, get_args

import httpx
import pytest
from pydantic import BaseModel, TypeAdapter

from tests.api.conftest import Live, serve
from upscale.control import schemas
from upscale.control.sweeps import merge
from upscale.fitting.laws import get_law
from upscale.orchestrator.settings import Settings
from upscale.sweeps.planner import plan
from upscale.sweeps.spec import SweepSpec, parse_spec

METHODS = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}


@pytest.fixture(scope="module")
def schema(live) -> dict[str, Any]:
    return httpx.get(f"{live.url}/openapi.json", timeout=30).json()


def _operations(schema: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in schema["paths"].items():
        for method, op in item.items():
            if method in METHODS:
                yield path, method, op


def test_openapi_documents_every_route(schema) -> None:
    for path, method, op in _operations(schema):
        assert op.get("summary") and op.get("description"), f"{method.upper()} {path} undocumented"
        assert {"200", "201", "204"} & set(op["responses"]), f"{method.upper()} {path} has no success response"
        assert all(r.get("description") for r in op["responses"].values()), f"{method.upper()} {path}"
    assert "HTTPBearer" in schema["components"]["securitySchemes"]


def test_every_operation_is_listed_once(live, schema) -> None:
    """Swagger UI and ReDoc list an operation under each of its tags: one tag each, so none shows twice; and no
    operation is registered twice (a router included twice repeats its operation ids, which FastAPI warns of)."""
    ops = list(_operations(schema))
    assert [(path, method) for path, method, op in ops if len(op.get("tags", [])) != 1] == []
    ids = Counter(op["operationId"] for _, _, op in ops)
    assert [i for i, n in ids.items() if n > 1] == []
    live.app.openapi_schema = None  # built again, now with warnings as errors
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rebuilt = live.app.openapi()
    assert rebuilt["paths"].keys() == schema["paths"].keys()


def _walk(node: Any, pointer: str = "#") -> Iterator[tuple[str, Any]]:
    """(JSON pointer, value) of every node under ``node``."""
    yield pointer, node
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        yield from _walk(value, f"{pointer}/{key}")


def test_every_ref_resolves(schema) -> None:
    """The sweep spec's models are added to the components by hand (the body is read raw): none may be missing."""
    refs = {value for _, node in _walk(schema) if isinstance(node, dict) for key, value in node.items()
            if key == "$ref"}
    assert refs and all(r.startswith("#/components/schemas/") for r in refs), refs
    assert sorted(r.rsplit("/", 1)[1] for r in refs if r.rsplit("/", 1)[1] not in schema["components"]["schemas"]) \
        == []


def _models(*roots: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """Every pydantic model reachable from ``roots`` through field types, by class name (the component's name)."""
    found: dict[str, type[BaseModel]] = {}
    stack: list[Any] = list(roots)
    while stack:
        t = stack.pop()
        if isinstance(t, type) and issubclass(t, BaseModel):
            if t.__name__ in found:
                continue
            found[t.__name__] = t
            stack += [f.annotation for f in t.model_fields.values()]
        else:
            stack += get_args(t)
    return found


def _check(adapter: TypeAdapter[Any], example: Any) -> Any:
    """Strict, as JSON: the example must be what a client sends, with no string standing for a number."""
    return adapter.validate_json(json.dumps(example), strict=True)


def _examples(node: dict[str, Any]) -> list[Any]:
    """A schema's `example` and JSON Schema `examples` (a list), or a media type's `examples` (name -> {value})."""
    listed = node.get("examples", [])
    values = [e["value"] for e in listed.values()] if isinstance(listed, dict) else list(listed)
    return values + ([node["example"]] if "example" in node else [])


def test_every_example_validates_against_its_model(schema) -> None:
    models = _models(SweepSpec, *(m for m in vars(schemas).values()
                                  if isinstance(m, type) and issubclass(m, BaseModel)))
    checked: list[str] = []
    for name, component in schema["components"]["schemas"].items():
        if "examples" in component or "example" in component:
            assert name in models, f"no model for component {name}"
            for example in _examples(component):
                _check(TypeAdapter(models[name]), example)
            checked.append(f"#/components/schemas/{name}")
        for prop, sub in component.get("properties", {}).items():
            if "examples" in sub or "example" in sub:
                field = models[name].model_fields[prop]
                adapter = TypeAdapter(Annotated[field.annotation, field])  # with its constraints
                for example in _examples(sub):
                    _check(adapter, example)
                checked.append(f"#/components/schemas/{name}/properties/{prop}")
    for path, method, op in _operations(schema):
        for media_type, media in op.get("requestBody", {}).get("content", {}).items():
            if _examples(media):
                for example in _examples(media):
                    _check(_adapter(models, media["schema"]), example)
                checked.append(f"#/paths/{path}/{method}/requestBody/content/{media_type}")
        for status, response in op.get("responses", {}).items():  # a response's example is what its model returns
            for media_type, media in response.get("content", {}).items():
                if _examples(media):
                    for example in _examples(media):
                        _check(_adapter(models, media["schema"]), example)
                    checked.append(f"#/paths/{path}/{method}/responses/{status}/content/{media_type}")
    # Nothing carries an example this test did not check (a parameter's, a response's, a nested schema's).
    everywhere = [p.rsplit("/", 1)[0] for p, _ in _walk(schema) if p.endswith(("/example", "/examples"))]
    assert sorted(set(everywhere) - set(checked)) == []
    assert "#/components/schemas/FitCreate/properties/law" in checked
    assert {"#/components/schemas/RefitScheduleCreate", "#/paths//refits/get/responses/200/content/application/json",
            "#/paths//refit-schedules/{schedule_id}/run/post/responses/201/content/application/json"} <= set(checked)


def test_the_refit_schedule_examples_are_accepted(live, schema) -> None:
    """Each whole-body example of POST /refit-schedules, sent with a real sweep id, creates a schedule; no body
    field names a law or a fixed parameter (a refit runs the analysis, which chooses its laws)."""
    from tests.api.test_analysis import fill

    body = schema["components"]["schemas"]["RefitScheduleCreate"]
    request = schema["components"]["schemas"]["RefitRequest"]
    assert set(request["properties"]) == {"sweep_ids", "bootstrap", "n1"} and not request["additionalProperties"]
    assert request["properties"]["bootstrap"]["default"] == schemas.DEFAULT_ANALYSIS_BOOTSTRAP
    sweep = fill(live.app.state.services)
    with live.client() as c:
        for example in _examples(body):
            sent = {**example, "request": {**example["request"], "sweep_ids": [sweep]}}
            r = c.post("/refit-schedules", json=sent)
            assert r.status_code == 201, r.text
            assert r.json()["request"] == {"n1": None, "bootstrap": 100, **sent["request"]}
            assert c.delete(f"/refit-schedules/{r.json()['id']}").status_code == 204


def _adapter(models: dict[str, type[BaseModel]], schema: dict[str, Any]) -> TypeAdapter[Any]:
    """What a body's or a response's schema holds: a model, a list of models (GET /refits' answer), or (the
    observation rows) a list of objects."""
    if "$ref" in schema:
        return TypeAdapter(models[schema["$ref"].rsplit("/", 1)[1]])
    assert schema["type"] == "array", schema
    items = schema["items"]
    if "$ref" not in items:
        return TypeAdapter(list[dict[str, Any]])
    model = models[items["$ref"].rsplit("/", 1)[1]]
    return TypeAdapter(list[model])  # type: ignore[valid-type]


def test_every_request_body_has_a_whole_example(schema) -> None:
    """Swagger UI's "Try it out" starts from a body's example, or else builds one from the fields, which for a
    `dict` field is `{"additionalProp1": {}}` and for FitCreate gives both sources: every body with a schema carries
    whole examples of its own (validated against the model above), none of them made up of placeholders."""
    bodies = []
    for path, method, op in _operations(schema):
        for media_type, media in op.get("requestBody", {}).get("content", {}).items():
            component = schema["components"]["schemas"][media["schema"]["$ref"].rsplit("/", 1)[1]]
            examples = _examples(media) or _examples(component)
            assert examples, f"{method.upper()} {path} ({media_type}) has no whole-body example"
            assert "additionalProp" not in json.dumps(examples)
            bodies.append(path)
    assert {"/sweeps/{sweep_id}/extend", "/sweeps/{sweep_id}/suggest", "/sweeps/{sweep_id}/analysis"} <= set(bodies)


def test_extension_examples_plan_on_every_sweep_example(schema) -> None:
    """An extension's example, applied to each of POST /sweeps' examples as POST .../extend applies it, is a grid
    that plans, with more segments than the sweep it extends."""
    extensions = _examples(schema["components"]["schemas"]["SweepExtend"])
    specs = _examples(schema["paths"]["/sweeps"]["post"]["requestBody"]["content"]["application/json"])
    assert extensions and specs
    for extension in extensions:
        for spec in specs:
            grown = plan(parse_spec(merge(spec, extension["additions"])))
            assert len(grown.segments) > len(plan(parse_spec(spec)).segments), (extension, spec["name"])


def test_sweep_responses_have_real_examples(schema) -> None:
    """Every JSON success answer of the sweep routes (but the suggestion's) shows a body built from a real plan."""
    for path, method, op in _operations(schema):
        if not path.startswith("/sweeps") or path.endswith(("/suggest", "/calibration", "/analysis", "/analyses")):
            continue
        for status in {"200", "201"} & set(op["responses"]):
            media = op["responses"][status].get("content", {}).get("application/json")
            if media is None or (status == "200" and "201" in op["responses"]):  # an `existing` 200: the 201's body
                continue
            assert _examples(media), f"{method.upper()} {path} {status}"
            assert "additionalProp" not in json.dumps(_examples(media))
    suggestion = schema["paths"]["/sweeps/{sweep_id}/suggest"]["post"]["responses"]["200"]["content"]
    (example,) = _examples(suggestion["application/json"])  # its actions add up as the route's answers do
    assert example["total_flops"] == pytest.approx(sum(a["marginal_flops"] for a in example["actions"]))
    assert example["additions"] == functools.reduce(merge, (a["additions"] for a in example["actions"]), {})
    detail = schema["paths"]["/sweeps/{sweep_id}"]["get"]["responses"]["200"]["content"]["application/json"]
    (example,) = _examples(detail)
    t = example["timing"]
    assert 0 < t["segments_trained"] < t["segments_to_train"] and t["time_left_s"] > 0


def test_fit_examples_name_real_laws(schema) -> None:
    """`law` is any string to the model (the fitter lists the valid ones), so the examples are checked here."""
    fit = schema["components"]["schemas"]["FitCreate"]
    laws = _examples(fit["properties"]["law"]) + [e["law"] for e in _examples(fit)]
    assert laws
    for law in laws:
        get_law(law)


def test_sweep_body_is_the_spec_with_examples_that_plan(schema) -> None:
    body = schema["paths"]["/sweeps"]["post"]["requestBody"]
    assert body["required"] and body["content"].keys() == {"application/json", "application/yaml"}
    spec_schema = SweepSpec.model_json_schema(ref_template="#/components/schemas/{model}")
    assert schema["components"]["schemas"]["SweepSpec"]["properties"] == spec_schema["properties"]
    for media in body["content"].values():
        assert media["schema"] == {"$ref": "#/components/schemas/SweepSpec"}
        assert len(_examples(media)) >= 3
        for example in _examples(media):
            p = plan(parse_spec(example))
            assert p.segments and len(p.observations()) > 0


def _schemathesis_finds_no_server_error(live: Live, examples: int = 8) -> None:
    """No 5xx in ``examples`` generated requests per operation, and not vacuously: the spec examples reach the
    planner, so sweeps are stored (nothing else submits on this server)."""
    st = Path(sys.executable).parent / "schemathesis"
    run = subprocess.run(
        [str(st), "run", f"{live.url}/openapi.json", "--checks", "not_a_server_error", "--max-examples",
         str(examples), "--phases", "examples,fuzzing", "--workers", "1", "--request-timeout", "30",
         "-H", f"Authorization: {live.write['Authorization']}", "--generation-deterministic"],
        capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    with live.client() as c:
        stored = {s["name"] for s in c.get("/sweeps").json()}
    assert stored & {"demo", "tiny", "scratch-and-drop", "lr-search"}, stored


def test_schemathesis_finds_no_server_error(live) -> None:
    _schemathesis_finds_no_server_error(live)


@pytest.mark.postgres
@pytest.mark.slow  # ~20 s on CI's 2 cores (make test stays under 10 minutes)
def test_schemathesis_finds_no_server_error_on_postgresql(tmp_path, mlflow_uri, postgres_url) -> None:
    """The same run on PostgreSQL, which answers a NUL character in a text parameter with an error where SQLite
    finds nothing: schemathesis sends NULs in ids, names and bodies. 40 examples per operation (~20 s): enough to
    find the 500 a NUL gave before ids and NULs were refused at the edge, which 8 did not."""
    settings = Settings(home=tmp_path, mlflow_tracking_uri=mlflow_uri, db_url=postgres_url)
    with serve(settings, scheduler=False) as live:
        _schemathesis_finds_no_server_error(live, examples=40)
