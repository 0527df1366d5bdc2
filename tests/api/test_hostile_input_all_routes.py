"""Every route of the app (its ``url_map``: the API, /ops, the library page, login, /metrics,
static files, the docs) under hostile input: never a 5xx; an /api or health route answers a 4xx
with the JSON error body ``{"error": <code>, "message": …}``; and a refused request leaves no row
and no file behind (SPEC §2.8, §9).

Unlike tests/api/test_fuzz.py (schemathesis over the documented operations), this walks the
routing table itself, so an undocumented route, a page or a static folder cannot be missed, and
it sends what no schema generates: raw bytes in the path and the query string as a WSGI server
hands them over (latin-1 decoded), overlong UTF-8, lying Content-Type / Content-Encoding /
Content-Length, multipart filenames with NUL, ``../`` or 10k characters, and header garbage.
Every rule and method gets the path, query and header probes; every route that takes a body also
gets the body probes, and every documented field of a JSON body gets every wrong type.
"""

from __future__ import annotations

import collections
import gzip
import json
import os
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote_to_bytes

import pytest
from sqlalchemy import text

from app.api import create_app
from app.auth import LocalScopeResolver, TokenScopeResolver, create_scope, create_token
from app.orchestrator import Orchestrator
from tests.api.conftest import png_bytes, upload

# --- hostile values ---------------------------------------------------------------------------

#: Path segments, percent-encoded as a client sends them (the WSGI server unquotes to bytes).
PATH_SEGMENTS = [
    "%00", "a%00b", "%ED%A0%80", "%C0%AF", "%E0%80%AF", "%F0%80%80%AF", "%FF%FE", "x" * 10_000,
    "not-a-uuid", str(2**64), "-1", "0", "..%2F..%2Fetc%2Fpasswd", "../../etc/passwd", "%2e%2e", "%20",
    "00000000-0000-0000-0000-000000000000", "%EF%BC%91", "%D9%A1%D9%A2",
]

#: Query values, percent-encoded (NUL, lone surrogate, overlong, non-ASCII digits, empty, huge …).
QUERY_VALUES = [
    "%00", "1%00", "%ED%A0%80", "%C0%B1", "%D9%A1%D9%A2", "%EF%BC%95", "", "x" * 10_000,
    "9" * 5000, str(2**64), "-1", "1e309", "nan", "1.5", "%FF",
]
#: A uuid converter refuses all of these alike at routing: a sample of them is enough there.
UUID_SEGMENTS = ["%00", "%ED%A0%80", "%C0%AF", "x" * 10_000, "not-a-uuid", str(2**64), "-1", "%EF%BC%91"]

#: Query parameter names any route might read (the documented ones are added per operation).
COMMON_PARAMS = ["limit", "cursor", "after", "q", "next", "older", "msg", "err"]

#: Raw (not percent-encoded) query strings: bytes a client may put there, as latin-1 text.
RAW_QUERIES = ["limit=\xff\xfe", "q=\x00", "%", "%%%", "a=%zz", "&&&==&", "limit=1&limit=2&limit=%00",
               "cursor=" + "A" * 20_000, "a" * 20_000, ";limit=1", "\t\n"]

#: Values of the wrong type (or hostile text) for a JSON field.
WRONG_TYPES: list[Any] = [
    None, True, 0, -1, 2**64, -(2**64), 10**400, 1.5, 1e308, "", " ", "x" * 10_000, "\x00", "a\x00b",
    "\ud800", "\udfff", "\u202e\u0000", [], [None], ["\x00"], [[[]]], {}, {"a": 1}, {"\x00": 1},
]

#: Headers; every route gets each (non-latin-1 text arrives as its UTF-8 bytes read as latin-1).
_CJK = "中文令牌".encode().decode("latin-1")
HEADER_SETS: list[dict[str, str]] = [
    {"Authorization": "Bearer a\x00b"},
    {"Authorization": f"Bearer {_CJK}"},
    {"Authorization": "Bearer " + "x" * 10_000},
    {"Authorization": "Basic %%%"},
    {"Authorization": "Bearer"},
    {"Accept": "text/event-stream;q=nan, */*;q=-1"},
    {"Accept": "\x00/\x00"},
    {"Accept": ";;;,,,q=", "Accept-Encoding": "gzip;q=2, br;q=x", "Accept-Language": "\xff"},
    {"If-None-Match": 'W/"\x00", *, "' + "a" * 5000},
    {"If-None-Match": "garbage", "If-Modified-Since": "not a date"},
    {"If-Modified-Since": "Mon, 99 Foo 99999 99:99:99 GMT", "If-Unmodified-Since": "\x00"},
    {"Range": "bytes=999999999999999999999-"},
    {"Range": "bytes=-0, 5-1, x-y"},
    {"Range": "lines=1-2", "If-Range": '"nope"'},
    {"Cookie": "memeflow_session=\x00; memeflow_csrf=" + _CJK},
    {"Cookie": "=; ;;=;" + "a" * 5000},
    {"Origin": "null", "Sec-Fetch-Site": "cross-site"},
    {"X-Forwarded-For": "\x00, 999.1.1.1", "Forwarded": "for=\"[::1\""},
    {"Host": "localhost:99999"},
    {"Last-Event-ID": "\x00"}, {"Last-Event-ID": "9" * 5000}, {"Last-Event-ID": "-1"},
    {"Last-Event-ID": "\xb2"}, {"Last-Event-ID": "1e3"},
    {"Content-Type": "application/json; charset=x-unknown"},
]

#: Headers for the events route: Last-Event-ID is read only by a stream.
SSE = {"Accept": "text/event-stream"}


def _multipart(parts: list[tuple[bytes, bytes, bytes | None]], boundary: bytes = b"fuzzbound") -> tuple[bytes, str]:
    """A multipart body of ``(name, value, filename)`` parts, bytes exactly as given."""
    out = b""
    for name, value, filename in parts:
        disp = b'form-data; name="' + name + b'"' + (b'; filename="' + filename + b'"' if filename is not None else b"")
        out += b"--" + boundary + b"\r\nContent-Disposition: " + disp + b"\r\n"
        if filename is not None:
            out += b"Content-Type: image/png\r\n"
        out += b"\r\n" + value + b"\r\n"
    return out + b"--" + boundary + b"--\r\n", "multipart/form-data; boundary=" + boundary.decode()


# --- probes -----------------------------------------------------------------------------------


@dataclass
class Probe:
    method: str
    path: str  # percent-encoded, as on the request line
    query: str = ""  # the raw query string
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None
    content_type: str | None = None
    environ: dict[str, str] = field(default_factory=dict)
    what: str = ""
    rule: str = ""  # the url_map rule this probe was built for

    def label(self) -> str:
        short = lambda s: s if len(s) <= 80 else s[:60] + f"…({len(s)})"  # noqa: E731
        return f"{self.method} {short(self.path)}?{short(self.query)} [{self.what}]"


_ARG = re.compile(r"<(?:([^:<>]+):)?([^<>]+)>")


def _fill(rule: str, values: dict[str, str]) -> str:
    return _ARG.sub(lambda m: values[m.group(2)], rule)


def _wsgi_path(path: str) -> str:
    """PATH_INFO as a WSGI server builds it: the request line's path unquoted to bytes, as latin-1."""
    return unquote_to_bytes(path).decode("latin-1")


def _run(client, probe: Probe):
    environ = {"PATH_INFO": _wsgi_path(probe.path), "QUERY_STRING": probe.query,
               "REQUEST_URI": probe.path + ("?" + probe.query if probe.query else ""), **probe.environ}
    headers = dict(probe.headers)
    for name in [n for n in headers if n.lower() in ("host", "content-type")]:  # not plain headers in WSGI
        environ["HTTP_HOST" if name.lower() == "host" else "CONTENT_TYPE"] = headers.pop(name)
    for name, value in headers.items():  # straight into the environ: the test client would encode them
        environ["HTTP_" + name.upper().replace("-", "_")] = value
    kwargs: dict[str, Any] = {"method": probe.method, "environ_overrides": environ}
    if probe.body is not None:
        kwargs["data"] = probe.body
    if probe.content_type is not None and "CONTENT_TYPE" not in environ:
        kwargs["content_type"] = probe.content_type
    response = client.open("/", **kwargs)
    try:
        body = response.get_data()  # a streamed body (SSE) runs its generator here
    finally:
        response.close()  # a HEAD of a static file leaves its file open otherwise
    return response, body


# --- the app under test -----------------------------------------------------------------------

COUNTED = ("images", "processing_jobs", "job_stages", "tasks", "batches", "batch_items", "api_tokens",
           "browser_sessions", "webhook_subscriptions", "visual_embeddings", "text_embeddings", "scopes",
           "operation_grants", "events")


_COUNTS = text("SELECT " + ", ".join(f"(SELECT count(*) FROM {t}) AS {t}" for t in COUNTED))


def _snapshot(conn, storage: Path) -> tuple[dict[str, int], frozenset[str]]:
    """Row counts of the tables a request could leave rows in, and every file under storage."""
    counts = dict(conn.execute(_COUNTS).mappings().one())
    files = frozenset(os.path.join(d, f) for d, _, names in os.walk(storage) for f in names)
    return counts, files


def _make_app(settings, engine, publisher, store, resolver):
    settings = settings.replace(event_max_wait_s=0.05, event_stream_max_s=0.05, event_heartbeat_s=0.02)
    return create_app(scope_resolver=resolver, settings=settings, orchestrator=Orchestrator(engine, settings),
                      engine=engine, publisher=publisher, store=store, cursor_secret_key="test-secret")


def _seed(client) -> dict[str, str]:
    """A real image, job, task and batch, so that a hostile body reaches the view behind the 404."""
    first = upload(client, png_bytes((1, 2, 3)), display_name="seed").get_json()
    job = client.get(f"/api/v1/jobs/{first['job']['id']}").get_json()
    batch = client.post("/api/v1/batches", json={"image_ids": [first["image"]["id"]]}).get_json()
    return {"image_id": first["image"]["id"], "job_id": first["job"]["id"],
            "task_id": next(s["task_id"] for s in job["stages"] if s["task_id"]),
            "batch_id": batch["batch"]["id"], "webhook_id": str(uuid.uuid4())}


def _static_names(app) -> dict[str, str]:
    """A real file of each static folder, by endpoint (so Range and If-None-Match reach send_file)."""
    out = {}
    for rule in app.url_map.iter_rules():
        if rule.endpoint.endswith("static"):
            bp = app.blueprints.get(rule.endpoint.rpartition(".")[0])
            folder = (bp or app).static_folder
            files = sorted(Path(folder).glob("*")) if folder and Path(folder).is_dir() else []
            out[rule.endpoint] = files[0].name if files else "none.css"
    return out


def _documented_fields(spec: dict, path: str, method: str) -> tuple[list[str], dict[str, list[str]]]:
    """The operation's query parameters and its body fields by media type (``context.title`` for a
    nested object's), from the app's own OpenAPI document."""
    op = (spec["paths"].get(path) or {}).get(method.lower()) or {}
    params = [p["name"] for p in op.get("parameters", []) if p["in"] == "query"]

    def props(schema: dict, prefix: str = "", depth: int = 0) -> list[str]:
        if "$ref" in schema:
            schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
        out = []
        for name, sub in (schema.get("properties") or {}).items():
            out.append(prefix + name)
            if depth < 1 and ("$ref" in sub or sub.get("properties")):
                out += props(sub, prefix + name + ".", depth + 1)
        return out

    bodies = {media: props(c["schema"]) for media, c in (op.get("requestBody") or {}).get("content", {}).items()}
    return params, bodies


def _openapi_path(rule: str) -> str:
    return _ARG.sub(lambda m: "{" + m.group(2) + "}", rule)


def _nest(dotted: str, value: Any) -> dict:
    head, _, rest = dotted.partition(".")
    return {head: _nest(rest, value) if rest else value}


def _json(value: Any) -> bytes:
    # allow_nan: a client may send NaN; ensure_ascii: a lone surrogate travels as its \\ud800 escape
    return json.dumps(value, ensure_ascii=True).encode("ascii")


def _body_probes(method: str, path: str, bodies: dict[str, list[str]]) -> Iterator[Probe]:
    def p(body: bytes | None, ctype: str | None, what: str, **kw) -> Probe:
        return Probe(method, path, body=body, content_type=ctype, what=what, **kw)

    js = "application/json"
    yield p(None, None, "no body")
    yield p(b"", js, "empty json")
    for raw in (b"{", b"{'a': 1}", b"\x00", b"\xff\xfe{}", b'{"a": "\\ud800"}', b'{"a": "\\u0000"}', b"[]", b"1",
                b'"s"', b"null", b"true", b"1" * 5000, b"[" * 10_000 + b"]" * 10_000, b'{"a":' * 10_000 + b"1" + b"}" * 10_000,
                b'{"a": NaN, "b": Infinity}', b'{"a": 1, "a": 2}', b'{"\\ud800": 1}', b"\xef\xbb\xbf{}",
                b'{"a": 1e999999}', b'{"a": ' + b"9" * 5000 + b"}", _json(list(range(100_000)))):
        yield p(raw, js, f"json {raw[:20]!r}")
    yield p(b'{"a": 1}', "text/plain", "json as text/plain")
    yield p(b'{"a": 1}', "application/x-www-form-urlencoded", "json as a form")
    yield p(b"a=%00&b=%ED%A0%80&a=1", "application/x-www-form-urlencoded", "hostile form")
    yield p(b'{"a": 1}', "application/json; charset=utf-16", "json utf-16 lie")
    yield p(b'{"a": 1}', js, "gzip lie", headers={"Content-Encoding": "gzip"})
    yield p(gzip.compress(b'{"a": 1}'), js, "real gzip", headers={"Content-Encoding": "gzip"})
    yield p(b'{"a": 1}', js, "odd encoding", headers={"Content-Encoding": "br, \x00, identity;q=x"})
    for cl in ("-1", "abc", "99999999999999999999", "1e3", " 5"):
        yield p(b'{"a": 1}', js, f"content-length {cl}", environ={"CONTENT_LENGTH": cl})
    yield p(b"--x\r\n", "multipart/form-data", "multipart without boundary")
    yield p(b"garbage", "multipart/form-data; boundary=zz", "multipart garbage")
    yield p(b"--zz\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.png\"\r\n\r\n" + png_bytes(),
            "multipart/form-data; boundary=zz", "multipart truncated")
    for media, names in bodies.items():
        if media == js:
            for name in names:
                for value in WRONG_TYPES:
                    yield p(_json(_nest(name, value)), js, f"{name}={value!r:.30}")
                yield p(_json(_nest(name, list(range(100_000)))), js, f"{name}=100k items")
                yield p(_json(_nest(name, ["x"] * 20_000)), js, f"{name}=20k strings")
            yield p(_json({n.split(".")[0]: "\x00" for n in names} | {"unknown\x00": 1}), js, "all fields NUL")
        else:
            yield from _multipart_probes(method, path, names)


def _multipart_probes(method: str, path: str, names: list[str]) -> Iterator[Probe]:
    png = png_bytes((9, 9, 9))
    filenames = [b"a\x00b.png", b"../../../etc/passwd", b"..\\..\\x.png", b"x" * 10_000 + b".png",
                 b"\xed\xa0\x80.png", b"\xc0\xaf.png", b"\xff\xfe.png", b"", b"con.png", b"a/b/c.png", b"%00.png"]
    for fname in filenames:
        body, ctype = _multipart([(b"file", png, fname)])
        yield Probe(method, path, body=body, content_type=ctype, what=f"filename {fname[:20]!r}")
    for name in [n for n in names if n != "file"]:
        for value in (b"\x00", b"a\x00b", b"\xed\xa0\x80", b"\xff", b"x" * 10_000, b"", b"-1", b"\xd9\xa1", str(2**64).encode()):
            body, ctype = _multipart([(b"file", png, b"v.png"), (name.encode(), value, None)])
            yield Probe(method, path, body=body, content_type=ctype, what=f"form {name}={value[:12]!r}")
        body, ctype = _multipart([(b"file", png, b"v.png"), (name.encode(), b"1", None), (name.encode(), b"2", None)])
        yield Probe(method, path, body=body, content_type=ctype, what=f"form {name} twice")
    for parts, what in (([(b"file", b"not an image", b"a.png")], "file not an image"),
                        ([(b"file", png, None)], "file as a plain field"),
                        ([(b"file", png, b"a.png"), (b"file", png, b"b.png")], "two files"),
                        ([(b"other", png, b"a.png")], "unknown file part"),
                        ([(b"\x00", b"1", None), (b"file", png, b"a.png")], "NUL field name"),
                        ([], "no parts")):
        body, ctype = _multipart(parts)
        yield Probe(method, path, body=body, content_type=ctype, what=what)


def _probes(app, real: dict[str, str], spec: dict) -> Iterator[Probe]:
    """Every rule × every method: path, query and header probes; body probes where a body goes."""
    statics = _static_names(app)
    for rule in sorted(app.url_map.iter_rules(), key=lambda r: r.rule):
        for method in sorted(rule.methods):
            good = {name: real.get(name) or statics.get(rule.endpoint) or "swagger-ui.css" for name in rule.arguments}
            if method == "DELETE":  # keep the seed: a real id is deleted once, at the very end
                good = {k: str(uuid.uuid4()) if k.endswith("_id") else v for k, v in good.items()}
            for probe in _rule_probes(rule.rule, rule.arguments, method, good, spec):
                probe.rule = rule.rule
                yield probe


def _rule_probes(rule: str, arguments, method: str, good: dict[str, str], spec: dict) -> Iterator[Probe]:
    path = _fill(rule, good)
    params, bodies = _documented_fields(spec, _openapi_path(rule), method)
    for name in arguments:
        for seg in UUID_SEGMENTS if f"<uuid:{name}>" in rule else PATH_SEGMENTS:
            yield Probe(method, _fill(rule, {**good, name: seg}), what=f"path {name}")
    yield Probe(method, path + "%00", what="path + NUL")
    yield Probe(method, path + "/%ED%A0%80/..", what="path + surrogate segment")
    if method in ("HEAD", "OPTIONS"):  # the GET's view (HEAD) or none (OPTIONS): headers only
        for headers in HEADER_SETS[::3]:
            yield Probe(method, path, headers=headers, what=f"headers {sorted(headers)}")
        return
    # query strings: each documented (or common) parameter × each hostile value, duplicated too
    for name in params or COMMON_PARAMS[:3]:
        for value in QUERY_VALUES:
            yield Probe(method, path, query=f"{name}={value}", what=f"query {name}")
        yield Probe(method, path, query=f"{name}=1&{name}=2&{name}=", what=f"query {name} thrice")
    yield Probe(method, path, query="&".join(f"{n}=%00" for n in COMMON_PARAMS + params), what="all params NUL")
    for raw in RAW_QUERIES:
        yield Probe(method, path, query=raw, what="raw query")
    for headers in HEADER_SETS:
        if "Last-Event-ID" in headers:
            headers = {**headers, **SSE}
        yield Probe(method, path, headers=headers, what=f"headers {sorted(headers)}")
    if method in ("POST", "PUT", "PATCH", "DELETE"):
        yield from _body_probes(method, path, bodies)


# --- the tests --------------------------------------------------------------------------------


def _is_api(path: str) -> bool:
    return path.startswith("/api/v1") or path in ("/api/openapi.json", "/healthz", "/readyz")


def _sweep(client, probes, engine, storage: Path, codes: collections.Counter | None = None) -> tuple[list[str], int]:
    """Run the probes; the failures (5xx, an API 4xx without its JSON error body, a refused write
    that left rows or files) and how many ran. A read may fill the thumbnail cache, and an accepted
    write may add rows: the baseline is taken again before the next write after either."""
    failures: list[str] = []
    before, stale, n = None, True, 0
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for probe in probes:
            n += 1
            stale, before = _probe(client, probe, conn, storage, stale, before, failures, codes)
    return failures, n


def _probe(client, probe: Probe, conn, storage: Path, stale: bool, before, failures: list[str],
           codes: collections.Counter | None):
    """Run one probe, append its failures; the (stale, baseline) for the next write."""
    writes = probe.method in ("POST", "PUT", "PATCH", "DELETE")
    if writes and stale:
        before, stale = _snapshot(conn, storage), False
    response, body = _run(client, probe)
    status = response.status_code
    if status >= 500:
        failures.append(f"{status} {probe.label()}: {body[:300]!r}")
    elif status >= 400 and _is_api(_wsgi_path(probe.path)) and probe.method != "HEAD":
        try:
            payload = json.loads(body)
            ok = (isinstance(payload, dict) and isinstance(payload.get("error"), str) and payload["error"]
                  and isinstance(payload.get("message"), str))
        except ValueError:
            ok = False
        if ok and codes is not None:
            codes[payload["error"]] += 1
        if not ok:
            failures.append(f"{status} without a JSON error body: {probe.label()}: {body[:200]!r}")
    if not writes or status < 400:
        return True, before
    after = _snapshot(conn, storage)
    if after != before:
        changed = {k: (before[0][k], after[0][k]) for k in COUNTED if before[0][k] != after[0][k]}
        failures.append(f"{status} left rows/files behind: {probe.label()}: {changed} "
                        f"files +{sorted(after[1] - before[1])[:3]}")
    return False, after


def test_every_route_survives_hostile_input(settings, engine, publisher, store):
    app = _make_app(settings, engine, publisher, store, LocalScopeResolver())
    client = app.test_client()
    real = _seed(client)
    spec = client.get("/api/openapi.json").get_json()
    rules = {(r.rule, m) for r in app.url_map.iter_rules() for m in r.methods}
    probes = list(_probes(app, real, spec))
    assert {(p.rule, p.method) for p in probes} == rules  # every rule, every method
    assert len(rules) >= 40, sorted(rules)  # the whole table: API, pages, login, metrics, static, docs
    codes: collections.Counter = collections.Counter()
    failures, n = _sweep(client, probes, engine, store.root, codes)
    # the hostile input reached the views' own checks, not only routing's 404
    assert {"invalid_text", "invalid_json", "validation_error", "invalid_stage", "invalid_reverse_image_policy",
            "missing_file", "unsupported_media_type", "invalid_cursor", "not_found"} <= set(codes), codes
    # the seed survived the sweep; deleting it for real still works
    assert client.get(f"/api/v1/images/{real['image_id']}").status_code == 200
    assert client.delete(f"/api/v1/images/{real['image_id']}").status_code == 204
    assert not failures, f"{len(failures)} of {n} probes failed:\n" + "\n".join(failures[:60])


def test_every_route_survives_hostile_credentials_in_token_mode(settings, engine, publisher, store):
    """Token mode: hostile Authorization headers, cookies and a login form, on every rule."""
    app = _make_app(settings, engine, publisher, store, TokenScopeResolver(engine))
    client = app.test_client()
    create_scope(engine, "alpha")
    _, token = create_token(engine, "alpha", "alpha-key")
    statics = _static_names(app)
    probes = []
    for rule in app.url_map.iter_rules():
        values = {name: statics.get(rule.endpoint, "swagger-ui.css") if "filename" in name or name == "name"
                  else str(uuid.uuid4()) for name in rule.arguments}
        for method in sorted(rule.methods):
            path = _fill(rule.rule, values)
            for headers in HEADER_SETS[:5] + [{"Authorization": f"Bearer {token}\x00"},
                                               {"Authorization": f"bearer  {token} "},
                                               {"Authorization": f"Bearer {token}", "Cookie": "memeflow_session=x"}]:
                probes.append(Probe(method, path, headers=headers, what=f"auth {headers!r:.40}", rule=rule.rule))
    for form in (b"token=%00&next=%ED%A0%80", b"token=" + quote(_CJK).encode() + b"&next=//evil.example",
                 b"token=" + b"x" * 10_000, b"next=javascript:alert(1)&token=" + token.encode() + b"%00",
                 b"\xff\xfe=\x00", b"token=a&token=b&csrf=%00"):
        for path in ("/login", "/logout"):
            probes.append(Probe("POST", path, body=form, content_type="application/x-www-form-urlencoded",
                                headers={"Origin": "http://localhost"}, what=f"form {form[:30]!r}"))
    probes.append(Probe("GET", "/login", query="next=%00%ED%A0%80" + "x" * 5000, what="login next"))
    failures, n = _sweep(client, probes, engine, store.root)
    assert not failures, f"{len(failures)} of {n} probes failed:\n" + "\n".join(failures[:60])


@pytest.mark.parametrize("path", ["/api/v1/images/%00", "/api/v1/search/text"])
def test_the_probe_runner_sees_what_a_server_would(settings, engine, publisher, store, path):
    """The runner is honest: a NUL in the path reaches routing as the byte, and a missing ``q`` is
    a 422 with a code — the sweep's assertions would see a failure."""
    app = _make_app(settings, engine, publisher, store, LocalScopeResolver())
    response, body = _run(app.test_client(), Probe("GET", path))
    assert response.status_code in (404, 422) and json.loads(body)["error"]


def test_a_raw_query_string_that_is_not_utf8_is_a_400_everywhere(settings, engine, publisher, store):
    """werkzeug decodes ``request.args`` strictly: raw non-UTF-8 bytes in the query string (which a
    development server or another WSGI server passes on) were a UnicodeDecodeError, a 500, in
    every view that reads one — the API's lists and searches, /ops, the library, /login."""
    app = _make_app(settings, engine, publisher, store, LocalScopeResolver())
    client = app.test_client()
    for path in ("/api/v1/images", "/api/v1/search/text", "/ops", "/", "/login"):
        response, body = _run(client, Probe("GET", path, query="limit=\xff\xfe&q=\xc0"))
        assert response.status_code == 400, (path, body[:200])
        assert json.loads(body)["error"] == "invalid_query_string"
    # percent-encoded, the same bytes are the view's to judge (a 422, not this guard's 400)
    response, body = _run(client, Probe("GET", "/api/v1/images", query="limit=%FF%FE"))
    assert response.status_code == 422 and json.loads(body)["error"] == "validation_error"
