"""Per-item failure isolation and memory bounds in the batched lanes (visual, embedding).

A batch may mix scopes. One item's failure — reported by the provider for that item, or a crash
of the whole call while that item is in it — fails, charges and annotates that item alone; the
others succeed on their first attempt with no error text. A batch holds at most the lane's
budget of decoded pixels (visual) or document characters (embedding), and at least one task.

The providers come from ``tests.support.poison`` through the registry's ``module:Class`` names.
"""

from __future__ import annotations

import pytest
from sqlalchemy import text

from app.orchestrator import Orchestrator, RecordingPublisher
from app.stages.providers import Providers
from app.worker.run import handle_hint
from tests.support import poison
from tests.support.pipeline import png_bytes, store_and_ingest

SMALL = (48, 40)  # 1920 pixels
POISONED = (poison.POISON_WIDTH, 40)


@pytest.fixture(autouse=True)
def _fresh_calls():
    poison.reset()
    yield
    poison.reset()


def _rows(engine, sql, **params):
    with engine.connect() as c:
        return c.execute(text(sql), params).mappings().all()


def _ingest(orch, pub, scope, seed, size=SMALL, **kwargs):
    res = store_and_ingest(orch, scope, png_bytes(seed, size), **kwargs)
    pub.publish(res.hints)
    return res


def _run(orch, providers, pub, lanes) -> list[int]:
    """Handle every hint of ``lanes`` (and the hints they publish) until none is left; other
    lanes' hints stay unrun. Returns how many tasks each handled hint claimed."""
    claimed, held = [], []
    while hints := pub.drain():
        for h in hints:
            if h.lane in lanes:
                claimed.append(handle_hint(orch, h.lane, h.task_id, "w", providers, pub))
            else:
                held.append(h)
    pub.publish(held)
    return claimed


def _visual_tasks(engine):
    return {r["image_id"]: r for r in _rows(
        engine, "SELECT t.image_id, t.scope_id, t.status, t.attempt_count, t.error, i.width"
                " FROM tasks t JOIN images i ON i.id = t.image_id WHERE t.lane = 'visual'")}


def _mixed_scope_batch_with_one_poisoned(engine, settings, provider: str):
    settings = settings.replace(visual_provider=provider)
    orch, pub = Orchestrator(engine, settings), RecordingPublisher()
    for seed in (1, 2, 3):
        _ingest(orch, pub, "tenant-a", seed)
    _ingest(orch, pub, "tenant-a", 4, POISONED)
    for seed in (5, 6, 7):
        _ingest(orch, pub, "tenant-b", seed)
    first = pub.drain()
    assert [h.lane for h in first] == ["visual", "visual"]  # one wake-up group per scope
    claimed = handle_hint(orch, "visual", first[0].task_id, "w", Providers(settings), pub)
    assert claimed == 7  # tenant-a's group, topped up with tenant-b's: one batch of two scopes
    return _visual_tasks(engine)


def _assert_only_the_poisoned_task_was_charged(tasks):
    bad = [t for t in tasks.values() if t["width"] == poison.POISON_WIDTH]
    good = [t for t in tasks.values() if t["width"] != poison.POISON_WIDTH]
    assert len(bad) == 1 and len(good) == 6
    assert {(t["status"], t["attempt_count"]) for t in good} == {("succeeded", 1)}
    assert [t["error"] for t in good] == [None] * 6
    assert bad[0]["attempt_count"] == 1 and bad[0]["scope_id"] == "tenant-a"
    return bad[0]


def test_an_item_the_provider_fails_on_fails_alone(engine, settings):
    tasks = _mixed_scope_batch_with_one_poisoned(engine, settings, "tests.support.poison:PoisonItemVisual")
    bad = _assert_only_the_poisoned_task_was_charged(tasks)
    assert bad["status"] == "failed" and bad["error"]["code"] == "poisoned_image"
    assert [len(sizes) for _, sizes, _ in poison.CALLS] == [7]  # still one provider call
    jobs = _rows(engine, "SELECT i.width, j.status, j.error FROM processing_jobs j JOIN images i ON i.id = j.image_id")
    assert {(j["width"], j["status"]) for j in jobs} == {(48, "running"), (poison.POISON_WIDTH, "failed")}
    assert [j["error"] for j in jobs if j["width"] == 48] == [None] * 6


def test_a_call_that_crashes_on_a_poisoned_item_is_bisected_and_charges_only_that_item(engine, settings):
    tasks = _mixed_scope_batch_with_one_poisoned(engine, settings, "tests.support.poison:PoisonBatchVisual")
    bad = _assert_only_the_poisoned_task_was_charged(tasks)
    # retryable (a crash), back in the queue; its error is its own call's, not the batch's
    assert bad["status"] == "queued" and bad["error"]["code"] == "internal_error"
    # generic text only: the exception's own text (paths, hosts) goes to the worker's log
    assert bad["error"]["message"] == "the stage failed unexpectedly; the worker's log has the details"
    failed_calls = [sizes for _, sizes, ok in poison.CALLS if not ok]
    assert sorted(failed_calls[0]) == [1920] * 6 + [poison.POISON_WIDTH * 40]  # the whole batch first
    assert failed_calls[-1] == [poison.POISON_WIDTH * 40]  # ... down to the poisoned image alone
    assert sum(len(sizes) for _, sizes, ok in poison.CALLS if ok) == 6  # every other image embedded once
    # nothing of the crash landed on another task, job or stage
    assert _rows(engine, "SELECT count(*) AS n FROM job_stages WHERE error IS NOT NULL")[0]["n"] == 1
    assert _rows(engine, "SELECT count(*) AS n FROM processing_jobs WHERE error IS NOT NULL")[0]["n"] == 0


def test_a_text_batch_that_fails_on_one_document_fails_only_that_task(engine, settings):
    settings = settings.replace(text_provider="tests.support.poison:PoisonBatchText", text_document_version="1")
    orch, pub = Orchestrator(engine, settings), RecordingPublisher()
    providers = Providers(settings)
    for i, scope in enumerate(["tenant-a"] * 3 + ["tenant-b"] * 3):
        _ingest(orch, pub, scope, 10 + i, display_name=f"meme {i}")
    _ingest(orch, pub, "tenant-b", 20, display_name=f"{poison.POISON_WORD} meme")
    _run(orch, providers, pub, {"visual", "agent"})
    embedding_hints = pub.drain()
    assert embedding_hints and {h.lane for h in embedding_hints} == {"embedding"}
    assert handle_hint(orch, "embedding", embedding_hints[0].task_id, "w", providers, pub) == 7  # both scopes
    pub.publish(embedding_hints[1:])
    _run(orch, providers, pub, {"embedding"})  # the other hints find their tasks done: nothing to claim
    tasks = _rows(engine, "SELECT i.display_name, t.scope_id, t.status, t.attempt_count, t.error FROM tasks t"
                          " JOIN images i ON i.id = t.image_id WHERE t.lane = 'embedding'")
    bad = [t for t in tasks if poison.POISON_WORD in t["display_name"]]
    good = [t for t in tasks if poison.POISON_WORD not in t["display_name"]]
    assert [(t["status"], t["attempt_count"], t["error"]) for t in good] == [("succeeded", 1, None)] * 6
    assert [(t["status"], t["attempt_count"], t["error"]["code"]) for t in bad] == [("failed", 1, "poisoned_document")]
    assert bad[0]["error"]["message"] == "the model rejected a call of 1 documents"
    statuses = _rows(engine, "SELECT i.display_name, j.status FROM processing_jobs j JOIN images i ON i.id = j.image_id")
    assert sorted(r["status"] for r in statuses) == ["failed"] + ["succeeded"] * 6


def test_a_visual_batch_claims_only_what_fits_its_pixel_budget_and_leaves_the_rest_claimable(engine, settings):
    small = SMALL[0] * SMALL[1]
    settings = settings.replace(visual_provider="tests.support.poison:PoisonItemVisual",
                                visual_batch_max_pixels=3 * small)
    orch, pub = Orchestrator(engine, settings), RecordingPublisher()
    for seed, size in [(1, SMALL), (2, SMALL), (3, (200, 150)), (4, SMALL), (5, SMALL), (6, SMALL)]:
        _ingest(orch, pub, "local", seed, size)  # one wake-up group, in this order
    claimed = _run(orch, Providers(settings), pub, {"visual"})
    # the budget stops the first batch before the large image; the large image, bigger than the
    # whole budget, still goes (alone); the last three fit exactly. Each left-out rest was re-hinted.
    assert claimed == [2, 1, 3]
    assert [sizes for _, sizes, _ in poison.CALLS] == [[small] * 2, [200 * 150], [small] * 3]
    statuses = _rows(engine, "SELECT status, attempt_count FROM tasks WHERE lane = 'visual'")
    assert {(r["status"], r["attempt_count"]) for r in statuses} == {("succeeded", 1)}


def test_the_top_up_of_a_batch_takes_only_what_its_remaining_budget_allows(engine, settings):
    small = SMALL[0] * SMALL[1]
    settings = settings.replace(visual_provider="tests.support.poison:PoisonItemVisual",
                                visual_batch_max_pixels=3 * small)
    orch, pub = Orchestrator(engine, settings), RecordingPublisher()
    for scope, seed in [("tenant-a", 1), ("tenant-a", 2), ("tenant-b", 3), ("tenant-b", 4)]:
        _ingest(orch, pub, scope, seed)
    assert _run(orch, Providers(settings), pub, {"visual"}) == [3, 1]  # a's group + one of b's; then b's rest
    assert [len(sizes) for _, sizes, _ in poison.CALLS] == [3, 1]


def test_a_text_batch_holds_at_most_its_character_budget(engine, settings):
    settings = settings.replace(text_provider="tests.support.poison:PoisonBatchText", text_document_version="1")
    orch, pub = Orchestrator(engine, settings), RecordingPublisher()
    providers = Providers(settings)
    for i in range(8):
        _ingest(orch, pub, "tenant-a" if i % 2 else "tenant-b", 30 + i, display_name="x" * (50 * i))
    _run(orch, providers, pub, {"visual", "agent"})
    costs = {r["id"]: r["cost"] for r in _rows(
        engine, "SELECT id, coalesce(length(display_name), 0) + length(context::text) AS cost FROM images")}
    budget = max(costs.values()) * 2
    bounded = Orchestrator(engine, settings.replace(embedding_batch_max_chars=budget))
    claimed = _run(bounded, providers, pub, {"embedding"})
    assert sum(claimed) == 8 and len([n for n in claimed if n]) > 1
    cost_of_document = {r["document"]: costs[r["image_id"]] for r in _rows(
        engine, "SELECT image_id, document FROM text_embeddings")}
    calls = [sizes for lane, sizes, _ in poison.CALLS if lane == "embedding"]
    assert sum(len(c) for c in calls) == 8
    docs_by_call = _documents_per_call(engine, calls)
    for docs in docs_by_call:
        assert len(docs) == 1 or sum(cost_of_document[d] for d in docs) <= budget
    statuses = _rows(engine, "SELECT status, attempt_count FROM tasks WHERE lane = 'embedding'")
    assert {(r["status"], r["attempt_count"]) for r in statuses} == {("succeeded", 1)}


def _documents_per_call(engine, calls: list[list[int]]) -> list[list[str]]:
    """The documents of each recorded call, matched by length (every length here is distinct)."""
    by_length = {len(r["document"]): r["document"] for r in _rows(engine, "SELECT document FROM text_embeddings")}
    assert len(by_length) == 8
    return [[by_length[n] for n in sizes] for sizes in calls]


# --- output the database refuses: the item's own failure, not its batch's ----------------------


def test_a_vector_the_database_refuses_fails_its_own_item_only(engine, settings):
    """A NaN vector for one image of a mixed-scope batch: that task fails (provider_bad_output,
    permanent), the six others succeed on their first attempt — the completion is not aborted."""
    tasks = _mixed_scope_batch_with_one_poisoned(engine, settings, "tests.support.poison:PoisonVectorVisual")
    bad = _assert_only_the_poisoned_task_was_charged(tasks)
    assert bad["status"] == "failed" and bad["error"]["code"] == "provider_bad_output"
    assert [len(sizes) for _, sizes, _ in poison.CALLS] == [7]  # one provider call, no bisection


def test_a_zero_vector_fails_its_own_item_and_is_never_stored(engine, settings):
    """An all-zero vector is storable but no cosine can be computed against it (pgvector answers
    NaN, so a search ranked and scored garbage): that task fails (provider_bad_output), the six
    others succeed, and no visual embedding of it is stored."""
    tasks = _mixed_scope_batch_with_one_poisoned(engine, settings, "tests.support.poison:PoisonZeroVectorVisual")
    bad = _assert_only_the_poisoned_task_was_charged(tasks)
    assert bad["status"] == "failed" and bad["error"]["code"] == "provider_bad_output"
    assert _rows(engine, "SELECT count(*) AS n FROM visual_embeddings")[0]["n"] == 6


def test_a_provider_error_message_the_database_refuses_still_fails_its_item(engine, settings):
    """A provider's own error whose message holds NUL and an unpaired surrogate (and runs 100 kB):
    the task still fails with the provider's code — its message stored without the characters no
    column takes, and bounded — instead of the failure's write raising out of the worker (which
    left the task running, and its batch's hints unpublished, to fail the same way at every lease
    recovery)."""
    tasks = _mixed_scope_batch_with_one_poisoned(engine, settings, "tests.support.poison:PoisonMessageVisual")
    bad = _assert_only_the_poisoned_task_was_charged(tasks)
    assert bad["status"] == "failed" and bad["error"]["code"] == "poisoned_image"
    assert bad["error"]["message"].startswith("the model said: ") and len(bad["error"]["message"]) <= 2000


def test_a_document_vector_past_float4_fails_only_its_task(engine, settings):
    """1e39 is a finite float but overflows pgvector's float4: the poisoned document fails alone."""
    settings = settings.replace(text_provider="tests.support.poison:PoisonVectorText", text_document_version="1")
    orch, pub = Orchestrator(engine, settings), RecordingPublisher()
    providers = Providers(settings)
    for i, scope in enumerate(["tenant-a"] * 3 + ["tenant-b"] * 2):
        _ingest(orch, pub, scope, 40 + i, display_name=f"meme {i}")
    _ingest(orch, pub, "tenant-b", 50, display_name=f"{poison.POISON_WORD} meme")
    _run(orch, providers, pub, {"visual", "agent"})
    assert sum(_run(orch, providers, pub, {"embedding"})) == 6
    tasks = _rows(engine, "SELECT i.display_name, t.status, t.attempt_count, t.error FROM tasks t"
                          " JOIN images i ON i.id = t.image_id WHERE t.lane = 'embedding'")
    good = [t for t in tasks if poison.POISON_WORD not in t["display_name"]]
    bad = [t for t in tasks if poison.POISON_WORD in t["display_name"]]
    assert [(t["status"], t["attempt_count"], t["error"]) for t in good] == [("succeeded", 1, None)] * 5
    assert [(t["status"], t["attempt_count"], t["error"]["code"]) for t in bad] == [("failed", 1, "provider_bad_output")]
    assert _rows(engine, "SELECT count(*) AS n FROM text_embeddings")[0]["n"] == 5


def test_an_unstorable_openai_compatible_answer_fails_alone_and_its_batch_mate_keeps_its_paid_answer(
        engine, settings):
    """A remote agent batch of two paid calls; the answer for the poisoned image holds NUL in its
    title. The parser refuses it (agent_bad_output, that task alone); the other answer lands."""
    from tests.unit.stages.test_openai_compatible import FakeServer

    fake = FakeServer()
    fake.thread.start()
    try:
        settings = settings.replace(agent_provider="openai-compatible", agent_base_url=f"{fake.url}/poisoned/v1",
                                    agent_model="test-vlm", agent_timeout_s=5, agent_batch_size=2)
        orch, pub = Orchestrator(engine, settings), RecordingPublisher()
        providers = Providers(settings)
        _ingest(orch, pub, "tenant-a", 1)
        _ingest(orch, pub, "tenant-a", 2, POISONED)
        _run(orch, providers, pub, {"visual"})
        assert _run(orch, providers, pub, {"agent"})[0] == 2  # both paid calls in one batch
    finally:
        fake.httpd.shutdown()
        fake.httpd.server_close()
    assert len(fake.requests) == 2
    _assert_agent_batch_mate_kept(engine, lambda t: t["width"] == poison.POISON_WIDTH)


def test_an_agent_answer_the_database_refuses_fails_alone_and_its_batch_mate_keeps_its_paid_answer(
        engine, settings):
    """A provider whose answer holds NUL where no check looked (its pixel facts): the batch's
    completion is refused, so each claim is completed alone — the good answer lands, the bad one fails."""
    settings = settings.replace(agent_provider="tests.support.poison:PoisonOutputAgent", agent_batch_size=2)
    orch, pub = Orchestrator(engine, settings), RecordingPublisher()
    providers = Providers(settings)
    _ingest(orch, pub, "tenant-a", 1)
    _ingest(orch, pub, "tenant-a", 2, POISONED)
    _run(orch, providers, pub, {"visual"})
    assert _run(orch, providers, pub, {"agent"})[0] == 2  # both paid calls in one batch
    _assert_agent_batch_mate_kept(engine, lambda t: t["width"] == poison.POISON_WIDTH)


def test_a_single_task_run_whose_answer_the_database_refuses_fails_with_its_code(engine, settings):
    """``run_task`` (one claim, no batch) takes the same net: the refused completion fails the
    task with its provider's bad output instead of raising out of the worker (which would leave it
    running until its lease expired, to die the same way at every attempt)."""
    from app.worker.run import run_task

    settings = settings.replace(agent_provider="tests.support.poison:PoisonOutputAgent")
    orch, pub = Orchestrator(engine, settings), RecordingPublisher()
    providers = Providers(settings)
    _ingest(orch, pub, "tenant-a", 2, POISONED)
    _run(orch, providers, pub, {"visual"})
    (hint,) = [h for h in pub.drain() if h.lane == "agent"]
    assert run_task(orch, hint.task_id, "w", providers, pub) == "failed"
    (task,) = _rows(engine, "SELECT t.status, t.attempt_count, t.error, a.state FROM tasks t"
                            " JOIN task_attempts a ON a.task_id = t.id WHERE t.lane = 'agent'")
    assert (task["status"], task["attempt_count"], task["error"]["code"], task["state"]) \
        == ("failed", 1, "agent_bad_output", "failed")


def test_an_agent_answer_past_a_database_limit_fails_alone_and_its_batch_mate_keeps_its_paid_answer(
        engine, settings):
    """A provider's OCR text so long that its lexical document would pass PostgreSQL's tsvector
    limit ("string is too long for tsvector", SQLSTATE 54000 — an OperationalError, not a
    DataError): it is past the API's OCR text limit too, so the worker's context check fails it
    before any write (the completion's net, should such a value reach the database, completes each
    claim alone); the batch-mate's answer lands and the long one fails with agent_bad_output —
    nothing raises out of the worker (which left both tasks running, to die the same way at every
    lease recovery)."""
    from app.worker.run import run_task

    settings = settings.replace(agent_provider="tests.support.poison:OverlongTextAgent", agent_batch_size=2)
    orch, pub = Orchestrator(engine, settings), RecordingPublisher()
    providers = Providers(settings)
    _ingest(orch, pub, "tenant-a", 1)
    _ingest(orch, pub, "tenant-a", 2, POISONED)
    _run(orch, providers, pub, {"visual"})
    assert _run(orch, providers, pub, {"agent"}) == [2]  # both calls in one batch, one completion
    _assert_agent_batch_mate_kept(engine, lambda t: t["width"] == poison.POISON_WIDTH)
    # one claim alone (run_task, no batch) takes the same net
    _ingest(orch, pub, "tenant-b", 3, POISONED)
    _run(orch, providers, pub, {"visual"})
    (hint,) = [h for h in pub.drain() if h.lane == "agent"]
    assert run_task(orch, hint.task_id, "w", providers, pub) == "failed"


@pytest.mark.parametrize("agent", ["WrongTypesAgent", "OverlongContextAgent", "DeepFactsAgent", "NaNFactsAgent"])
def test_an_agent_context_of_the_wrong_shape_or_past_the_api_limits_fails_alone(engine, settings, agent):
    """An agent's context must be what a human may write through PATCH /images/{id}: four text
    fields of the right types within the API's limits. A context with tags that are a number (which
    crashed the completion of the whole batch, leaving both paid answers running until their lease
    expired) or an OCR text past the limit (stored, then refused when the edit form saved it back)
    fails its own task with agent_bad_output; the batch-mate's paid answer lands. So do pixel facts
    no JSON encoder writes (nested 100 000 deep: a RecursionError raised out of the worker, leaving
    both paid answers running, to end ``unknown_execution`` at their lease recovery) or jsonb cannot
    hold (NaN, infinity: silently stored as null)."""
    settings = settings.replace(agent_provider=f"tests.support.poison:{agent}", agent_batch_size=2)
    orch, pub = Orchestrator(engine, settings), RecordingPublisher()
    providers = Providers(settings)
    _ingest(orch, pub, "tenant-a", 1)
    _ingest(orch, pub, "tenant-a", 2, POISONED)
    _run(orch, providers, pub, {"visual"})
    assert _run(orch, providers, pub, {"agent"}) == [2]  # both paid calls in one batch
    _assert_agent_batch_mate_kept(engine, lambda t: t["width"] == poison.POISON_WIDTH)


def test_an_agents_unstorable_names_fall_back_and_never_fail_its_paid_answer(engine, settings):
    """A plugin agent's model name and request id are provenance, not a reason to fail a paid
    answer (as openai-compatible's own): a model name holding NUL made the database refuse the
    completion, failing a good context with agent_bad_output; a 10 000-character request id was
    stored as is. Both fall back to ours (the provider's configured model, no request id)."""
    settings = settings.replace(agent_provider="tests.support.poison:HostileNamesAgent", agent_batch_size=2)
    orch, pub = Orchestrator(engine, settings), RecordingPublisher()
    providers = Providers(settings)
    _ingest(orch, pub, "tenant-a", 1)
    _ingest(orch, pub, "tenant-a", 2, POISONED)
    _run(orch, providers, pub, {"visual"})
    assert _run(orch, providers, pub, {"agent"}) == [2]
    rows = _rows(engine, "SELECT i.width, t.status, t.error, a.state, a.provider_request_id AS rid,"
                         " i.context_provenance->>'model' AS model, i.context->>'title' AS title FROM tasks t"
                         " JOIN images i ON i.id = t.image_id JOIN task_attempts a ON a.task_id = t.id"
                         " WHERE t.lane = 'agent'")
    assert [(r["status"], r["error"], r["state"], r["model"]) for r in rows] \
        == [("succeeded", None, "completed", "deterministic-v1")] * 2
    bad = [r for r in rows if r["width"] == poison.POISON_WIDTH]
    assert bad[0]["rid"] is None and bad[0]["title"]


def _assert_agent_batch_mate_kept(engine, is_bad) -> None:
    """One agent task failed (agent_bad_output, its attempt closed as failed), the other succeeded,
    its context written; neither is left running or unknown."""
    tasks = _rows(engine, "SELECT i.width, i.context, t.status, t.attempt_count, t.error, a.state"
                          " FROM tasks t JOIN images i ON i.id = t.image_id"
                          " JOIN task_attempts a ON a.task_id = t.id WHERE t.lane = 'agent'")
    bad = [t for t in tasks if is_bad(t)]
    good = [t for t in tasks if not is_bad(t)]
    assert len(bad) == 1 and len(good) == 1, tasks
    assert (bad[0]["status"], bad[0]["attempt_count"], bad[0]["error"]["code"], bad[0]["state"]) \
        == ("failed", 1, "agent_bad_output", "failed")
    assert bad[0]["context"] is None
    assert (good[0]["status"], good[0]["attempt_count"], good[0]["error"]) == ("succeeded", 1, None)
    assert good[0]["context"]["title"] and good[0]["state"] == "completed"
