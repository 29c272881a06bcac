"""Structured output through the official openai client against the embedded model on the CPU:
every answer decoded under `response_format` parses and validates against its schema, whatever
the model would have said (a 135M model left alone wraps JSON in prose and markdown fences)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

jsonschema = pytest.importorskip("jsonschema")

from .smol import smol, smol_client, smol_name  # noqa: E402,F401  (fixtures)

S = {"type": "string", "maxLength": 12}  # strings bounded: a small model's greedy string may not end
I = {"type": "integer", "minimum": 0, "maximum": 99}
POINT = {"type": "object", "properties": {"x": I, "y": I}, "required": ["x", "y"], "additionalProperties": False}

# (what to ask, the schema): nested objects, arrays, enums, bounded numbers, required and
# optional properties, $ref, anyOf / allOf, const, patterns, formats, null.
SCHEMAS = [
    ("Describe a cat.", {"type": "object", "properties": {"name": S, "age": {"type": "integer", "minimum": 0,
     "maximum": 20}}, "required": ["name", "age"], "additionalProperties": False}),
    ("Pick a color.", {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}},
                       "required": ["color"]}),
    ("Is the sky blue?", {"enum": ["yes", "no"]}),
    ("Is water wet?", {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                       "additionalProperties": False}),
    ("Pick a digit.", {"type": "integer", "minimum": 1, "maximum": 9}),
    ("What is the temperature in Paris?", {"type": "object", "properties": {"celsius": {
        "type": "number", "minimum": -10, "maximum": 40}}, "required": ["celsius"], "additionalProperties": False}),
    ("Pick a small number.", {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 5}),
    ("List some letters.", {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3}),
    ("List a few numbers.", {"type": "array", "items": I, "maxItems": 4}),
    ("Describe a person.", {"type": "object", "properties": {"person": {
        "type": "object", "properties": {"name": S, "age": I}, "required": ["name", "age"],
        "additionalProperties": False}}, "required": ["person"], "additionalProperties": False}),
    ("List some ids.", {"type": "array", "maxItems": 3, "items": {
        "type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["id"],
        "additionalProperties": False}}),
    ("Describe a book.", {"type": "object", "properties": {"title": S, "year": {"type": "integer", "minimum": 1000,
     "maximum": 2030}, "subtitle": S}, "required": ["title"], "additionalProperties": False}),
    ("Draw a line.", {"$defs": {"point": POINT}, "type": "object", "properties": {
        "start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}}, "required": ["start", "end"],
        "additionalProperties": False}),
    ("Pick a color.", {"definitions": {"color": {"enum": ["red", "blue"]}}, "type": "object",
                       "properties": {"c": {"$ref": "#/definitions/color"}}, "required": ["c"]}),
    ("Say a number or a word.", {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9},
                                           {"type": "string", "maxLength": 5}]}),
    ("How many lives has a cat?", {"type": "object", "properties": {"kind": {"const": "cat"}, "lives": {
        "type": "integer", "minimum": 1, "maximum": 9}}, "required": ["kind", "lives"], "additionalProperties": False}),
    ("Give a zip code.", {"type": "object", "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                          "required": ["zip"], "additionalProperties": False}),
    ("When is new year?", {"type": "object", "properties": {"day": {"type": "string", "format": "date"}},
                           "required": ["day"], "additionalProperties": False}),
    ("Any note?", {"type": "object", "properties": {"note": {"type": ["string", "null"], "maxLength": 8}},
                   "required": ["note"], "additionalProperties": False}),
    ("Two booleans.", {"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 2}),
    ("Describe a zoo.", {"type": "object", "properties": {"pens": {"type": "array", "maxItems": 2, "items": {
        "type": "object", "properties": {"animal": {"enum": ["lion", "owl"]}, "count": {
            "type": "integer", "minimum": 1, "maximum": 5}}, "required": ["animal", "count"],
        "additionalProperties": False}}}, "required": ["pens"], "additionalProperties": False}),
    ("Give a and b.", {"allOf": [
        {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 5}}, "required": ["a"]},
        {"properties": {"b": {"type": "boolean"}}, "required": ["b"]}]}),
    ("Rate it.", {"type": "object", "properties": {"stars": {"type": "number", "minimum": 0, "maximum": 5},
                                                   "word": {"enum": ["good", "bad"]}},
                  "required": ["stars", "word"], "additionalProperties": False}),
    ("Name three fruits.", {"type": "array", "items": S, "minItems": 3, "maxItems": 3}),
]


def _ask(client, model: str, question: str, schema: dict, stream: bool) -> tuple[str, str]:
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}
    kw = dict(model=model, messages=[{"role": "user", "content": question + " Answer in JSON."}],
              response_format=fmt, temperature=0, max_tokens=96)
    if not stream:
        r = client.chat.completions.create(**kw)
        return r.choices[0].message.content, r.choices[0].finish_reason
    parts = list(client.chat.completions.create(stream=True, **kw))
    return "".join(p.choices[0].delta.content or "" for p in parts), parts[-1].choices[0].finish_reason


def test_every_answer_validates_against_its_schema(smol_client, smol_name):
    """24 schemas at once (continuously batched: one mask call a step for all of them), every
    other one streamed: each answer ends by the grammar ("stop") and validates."""
    with ThreadPoolExecutor(len(SCHEMAS)) as pool:
        answers = list(pool.map(lambda i: _ask(smol_client, smol_name, *SCHEMAS[i], stream=i % 2 == 1),
                                range(len(SCHEMAS))))
    checker = jsonschema.FormatChecker()
    for (question, schema), (text, finish) in zip(SCHEMAS, answers):
        assert finish == "stop", (question, text)
        jsonschema.validate(json.loads(text), schema, format_checker=checker)


def test_json_object_is_one_object_where_the_model_alone_writes_prose(smol_client, smol_name):
    msg = [{"role": "user", "content": "Give me a JSON object with a cat's name and age."}]
    free = smol_client.chat.completions.create(model=smol_name, messages=msg, temperature=0, max_tokens=24)
    with pytest.raises(ValueError):
        json.loads(free.choices[0].message.content)  # fenced in markdown, then prose: not JSON alone
    out = smol_client.chat.completions.create(model=smol_name, messages=msg, temperature=0, max_tokens=48,
                                              response_format={"type": "json_object"})
    assert out.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(out.choices[0].message.content), dict)


def test_completions_decode_under_a_schema_too_and_sampled_choices_validate(smol_client, smol_name):
    schema = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome", "Oslo"]}, "people": {
        "type": "integer", "minimum": 1, "maximum": 10_000_000}}, "required": ["city", "people"],
        "additionalProperties": False}
    out = smol_client.completions.create(model=smol_name, prompt="A European capital as JSON:", max_tokens=40,
                                         temperature=1.0, seed=5, n=3, extra_body={"response_format": {
                                             "type": "json_schema", "json_schema": {"name": "c", "schema": schema}}})
    for c in out.choices:
        assert c.finish_reason == "stop"
        jsonschema.validate(json.loads(c.text), schema)
    again = smol_client.completions.create(model=smol_name, prompt="A European capital as JSON:", max_tokens=40,
                                           temperature=1.0, seed=5, n=3, extra_body={"response_format": {
                                               "type": "json_schema", "json_schema": {"name": "c", "schema": schema}}})
    assert [c.text for c in again.choices] == [c.text for c in out.choices]  # seeded: the same draws


def test_the_clients_parse_helper_gets_its_pydantic_model_back(smol_client, smol_name):
    """`client.chat.completions.parse(response_format=Model)`: the client sends the model's strict
    schema ($defs, $ref, anyOf with null, additionalProperties false) and parses the answer."""
    pydantic = pytest.importorskip("pydantic")

    class Pet(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=10)
        legs: int = pydantic.Field(ge=0, le=8)

    class Owner(pydantic.BaseModel):
        pets: list[Pet] = pydantic.Field(max_length=2)
        nickname: str | None = pydantic.Field(max_length=10)

    out = smol_client.chat.completions.parse(model=smol_name, response_format=Owner, temperature=0, max_tokens=80,
                                             messages=[{"role": "user", "content": "Describe a pet owner."}])
    assert out.choices[0].finish_reason == "stop"
    assert isinstance(out.choices[0].message.parsed, Owner)
