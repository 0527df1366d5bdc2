"""Pure decisions: fingerprints, metadata hash, the stage planner and the retry policy."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

from app.orchestrator import fingerprints as fp
from app.orchestrator.planner import Action, ImageFacts, JobFacts, plan
from app.orchestrator.retry import decide_retry
from app.orchestrator.types import StageConfigs
from app.stages.errors import OutcomeUnknownError, PermanentError, RetryableError

CFG = StageConfigs(
    visual={"model": "v", "preprocess_version": "p1", "dims": 8},
    agent={"provider": "a", "model": "m"},
    text={"model": "t", "dims": 4, "document_version": "1"},
)
SHA = "a" * 64


def facts(visual_exists=False, text_exists=False, **kw) -> ImageFacts:
    base = dict(sha256=SHA, context_status="pending", provenance=None, metadata_hash=None,
                exists={"visual": visual_exists, "text_embedding": text_exists})
    base.update(kw)
    return ImageFacts(**base)


def job(**kw) -> JobFacts:
    base = dict(image_sha256=SHA, configs=CFG, reverse_image_policy="forbid")
    base.update(kw)
    return JobFacts(**base)


def ready_context(policy="forbid", sha=SHA):
    return dict(context_status="ready", metadata_hash="h" * 64,
                provenance={"image_sha256": sha, "agent_config_hash": CFG.agent_hash, "reverse_image_policy": policy})


def test_metadata_hash_is_canonical_and_ignores_provenance_and_key_order():
    a = fp.metadata_hash("n", {"title": "t", "tags": ["x"], "ocr_text": "o", "description": "d", "facts": {"w": 1}})
    b = fp.metadata_hash("n", {"description": "d", "ocr_text": "o", "tags": ["x"], "title": "t", "facts": {"w": 2}})
    assert a == b and len(a) == 64
    assert fp.metadata_hash("n2", {"title": "t"}) != fp.metadata_hash("n", {"title": "t"})
    assert fp.semantic_document("n", {"title": "t", "tags": ["a", "b"]}) == "name: n\ntitle: t\ntags: a, b"


def test_fresh_image_runs_visual_first():
    p = plan(facts(), job())
    assert p.actions == {"visual": Action.RUN, "agent": Action.WAIT, "text_embedding": Action.WAIT}
    assert p.fingerprints["text_embedding"] is None


def test_valid_prefix_is_reused_and_first_invalid_runs():
    p = plan(facts(visual_exists=True, **ready_context()), job())
    assert p.actions == {"visual": Action.REUSE, "agent": Action.REUSE, "text_embedding": Action.RUN}
    assert plan(facts(visual_exists=True, text_exists=True, **ready_context()), job()).complete


def test_context_under_forbid_is_not_valid_for_auto_and_stale_sha_is_invalid():
    assert plan(facts(visual_exists=True, **ready_context("forbid")), job(reverse_image_policy="auto")).run_stage == "agent"
    assert plan(facts(visual_exists=True, **ready_context(sha="b" * 64)), job()).run_stage == "agent"


def test_edited_context_is_valid_for_any_policy_and_forced_stage_reruns_once():
    edited = dict(context_status="edited", metadata_hash="h" * 64, provenance={"image_sha256": SHA, "edited": True})
    assert plan(facts(visual_exists=True, **edited), job(reverse_image_policy="auto")).run_stage == "text_embedding"
    forced = job(force_stages=frozenset({"visual"}))
    assert plan(facts(visual_exists=True), forced).run_stage == "visual"
    done = job(force_stages=frozenset({"visual"}), succeeded_in_job=frozenset({"visual"}))
    assert plan(facts(visual_exists=True), done).run_stage == "agent"


def test_fingerprints_are_deterministic_and_input_sensitive():
    assert fp.visual_fingerprint(SHA, CFG.visual) == fp.visual_fingerprint(SHA, dict(reversed(CFG.visual.items())))
    assert fp.visual_fingerprint(SHA, CFG.visual) != fp.visual_fingerprint("b" * 64, CFG.visual)
    assert fp.agent_fingerprint(SHA, "c", "forbid") != fp.agent_fingerprint(SHA, "c", "auto")
    assert fp.text_fingerprint(SHA, "m1", CFG.text) != fp.text_fingerprint(SHA, "m2", CFG.text)


NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def test_retry_decisions():
    r = random.Random(1)
    d = decide_retry(RetryableError("x"), attempt=1, max_attempts=3, now=NOW, base_s=2, max_s=60, rand=r)
    assert d.retry and NOW + timedelta(seconds=1) <= d.available_at <= NOW + timedelta(seconds=2)
    d3 = decide_retry(RetryableError("x"), attempt=3, max_attempts=5, now=NOW, base_s=2, max_s=60, rand=r)
    assert NOW + timedelta(seconds=4) <= d3.available_at <= NOW + timedelta(seconds=8)
    capped = decide_retry(RetryableError("x"), attempt=30, max_attempts=99, now=NOW, base_s=2, max_s=60, rand=r)
    assert capped.available_at <= NOW + timedelta(seconds=60)
    assert decide_retry(RetryableError("x"), attempt=3, max_attempts=3, now=NOW, base_s=1, max_s=1).code == \
        "max_attempts_exceeded"
    missing = RetryableError("x", code="file_missing", exhausted_code="file_missing")
    assert decide_retry(missing, attempt=2, max_attempts=3, now=NOW, base_s=1, max_s=1).retry
    spent = decide_retry(missing, attempt=3, max_attempts=3, now=NOW, base_s=1, max_s=1)
    assert not spent.retry and spent.code == "file_missing"
    perm = decide_retry(PermanentError("x", code="invalid_image"), attempt=1, max_attempts=3, now=NOW, base_s=1, max_s=1)
    assert not perm.retry and perm.code == "invalid_image"
    unk = decide_retry(OutcomeUnknownError("x"), attempt=1, max_attempts=3, now=NOW, base_s=1, max_s=1)
    assert unk.unknown and not unk.retry
    # a paid call is retried only when the error proves it did not happen
    server = RetryableError("500", code="agent_server_error", not_executed=False)
    assert decide_retry(server, attempt=1, max_attempts=3, now=NOW, base_s=1, max_s=1, paid_call=True).unknown
    refused = RetryableError("refused", code="agent_unreachable", not_executed=True)
    assert decide_retry(refused, attempt=1, max_attempts=3, now=NOW, base_s=1, max_s=1, paid_call=True).retry


def test_memoised_fingerprints_equal_the_canonical_hash_and_keep_value_types_apart():
    from app.orchestrator import fingerprints as fp

    sha = "ab" * 32
    cfg = {"model": "m", "preprocess_version": "1", "dims": 64}
    expected = fp.sha256_hex({"stage": "visual", "image_sha256": sha, "model": "m", "preprocess_version": "1",
                              "dims": 64})
    assert fp.visual_fingerprint(sha, cfg) == fp.visual_fingerprint(sha, dict(cfg)) == expected
    as_int = fp.visual_fingerprint(sha, {**cfg, "preprocess_version": 1})  # 1 and "1" encode differently
    as_bool = fp.visual_fingerprint(sha, {**cfg, "preprocess_version": True})  # 1 == True, but "true"
    assert len({expected, as_int, as_bool}) == 3
    assert as_bool == fp.sha256_hex({"stage": "visual", "image_sha256": sha, "model": "m",
                                     "preprocess_version": True, "dims": 64})
    text_cfg = {"model": "t", "dims": 8, "document_version": 4}
    assert fp.text_fingerprint(sha, "mh", text_cfg) == fp.sha256_hex({
        "stage": "text_embedding", "image_sha256": sha, "metadata_hash": "mh", "model": "t", "dims": 8,
        "document_version": 4})
    assert fp.text_fingerprint(sha, "mh", {**text_cfg, "model": ["odd"]})  # unhashable: still computed
    assert fp.agent_fingerprint(sha, "h", "allow") == fp.sha256_hex({
        "stage": "agent", "image_sha256": sha, "agent_config_hash": "h", "reverse_image_policy": "allow"})


def test_a_providers_retry_after_is_waited_out_within_a_cap():
    """A 429's Retry-After was parsed and then ignored: the task came back after our backoff (a few
    seconds) and spent an attempt on another refusal."""
    from app.orchestrator.retry import RETRY_AFTER_MAX_S

    r = random.Random(2)

    def at(retry_after):
        error = RetryableError("rate limited", code="agent_rate_limited", not_executed=True, retry_after_s=retry_after)
        return decide_retry(error, attempt=1, max_attempts=5, now=NOW, base_s=2, max_s=60, rand=r, paid_call=True)

    assert at(120).available_at == NOW + timedelta(seconds=120)  # beyond our own backoff's cap: honoured
    assert at(0.5).available_at >= NOW + timedelta(seconds=1)  # shorter than our backoff: ours
    assert at(10**9).available_at == NOW + timedelta(seconds=RETRY_AFTER_MAX_S)
    for unusable in (float("inf"), float("nan"), None):
        assert at(unusable).available_at <= NOW + timedelta(seconds=2)
