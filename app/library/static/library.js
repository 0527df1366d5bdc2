/* memeflow library page: uploads with live progress, search, look-alikes, context editing.
 *
 * Plain JavaScript, no build step, no third-party code. Everything goes through the public API
 * (/api/v1) with this page's CSRF token in a header; user text is only ever set as textContent.
 * Live progress follows the event stream (GET /api/v1/events, Server-Sent Events) when the server
 * has one, and polls GET /api/v1/jobs/<id> when it answers 404 or the stream breaks.
 */
(() => {
  'use strict';

  const TERMINAL = new Set(['succeeded', 'failed', 'blocked', 'unknown_execution', 'target_changed',
    'superseded', 'cancelled']);
  // a job that ended because the image changed: its image's work goes on in a newer job
  const REPLACED = new Set(['superseded', 'target_changed']);
  const EVENT_TYPES = ['job.succeeded', 'job.failed', 'job.blocked', 'job.unknown_execution', 'job.cancelled',
    'job.superseded', 'job.target_changed', 'image.deleted', 'batch.progress', 'batch.completed', 'batch.cancelled'];
  const UPLOAD_CONCURRENCY = 3;
  const POLL_MS = 1000;
  const POLL_BATCH = 8;
  const SAFETY_POLL_MS = 10000;
  const SAFETY_POLL_BATCH = 40;
  const EVENTS_PAGE = 100;

  const $ = (sel, root = document) => root.querySelector(sel);
  const meta = (name) => (document.querySelector(`meta[name="${name}"]`) || {}).content || '';
  const csrfHeaders = () => ({ [meta('csrf-header') || 'X-CSRF-Token']: meta('csrf-token') });

  /** An element with attributes and children (strings become text nodes, never HTML). */
  function el(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (v === null || v === undefined || v === false) continue;
      if (k === 'dataset') Object.assign(node.dataset, v);
      else if (k === 'text') node.textContent = v;
      else node.setAttribute(k, v === true ? '' : String(v));
    }
    for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return node;
  }

  /** fetch against the API: JSON in and out, this page's CSRF header, never throws on 4xx/5xx. */
  async function api(path, { method = 'GET', json, body, headers = {} } = {}) {
    const opts = { method, credentials: 'same-origin', headers: { Accept: 'application/json', ...csrfHeaders(), ...headers } };
    if (json !== undefined) {
      opts.body = JSON.stringify(json);
      opts.headers['Content-Type'] = 'application/json';
    } else if (body !== undefined) {
      opts.body = body;
    }
    let resp;
    try {
      resp = await fetch(path, opts);
    } catch (err) {
      return { status: 0, ok: false, body: { error: 'network_error', message: String(err) } };
    }
    let data = null;
    try { data = await resp.json(); } catch (_) { data = null; }
    return { status: resp.status, ok: resp.ok, body: data };
  }

  const errorText = (r) => (r.body && r.body.error ? `${r.body.error}: ${r.body.message || ''}` : `HTTP ${r.status}`);
  const imageUrl = (id) => `/library/images/${encodeURIComponent(id)}`;
  const thumbUrl = (img, size = 256) =>
    `/api/v1/images/${encodeURIComponent(img.id)}/thumbnail?size=${size}&v=${encodeURIComponent(img.sha256)}`;

  /** A grid card, the same markup as templates/library/_card.html. */
  function card(img, { score, highlight, status } = {}) {
    const name = img.display_name || String(img.id).slice(0, 12) + '…';
    const jobStatus = status || (img.latest_job && img.latest_job.status);
    const caption = el('figcaption', {}, el('a', { class: 'name', href: imageUrl(img.id) }, name));
    if (jobStatus) caption.append(' ', el('span', { class: `chip s-${jobStatus}` }, jobStatus));
    if (typeof score === 'number') caption.append(' ', el('span', { class: 'score' }, score.toFixed(3)));
    const node = el('figure', { class: 'card', dataset: { imageId: img.id, sha: img.sha256 } },
      el('a', { class: 'thumb', href: imageUrl(img.id) },
        el('img', { src: thumbUrl(img), alt: name, loading: 'lazy', width: 256, height: 256 })),
      caption);
    if (highlight) node.append(highlightNode(highlight));
    node.append(el('button', { type: 'button', class: 'lookalike', dataset: { imageId: img.id } }, 'look-alikes'));
    return node;
  }

  /** The search hit's highlight: its text with <mark> around the [start, end) spans. The spans
   * count characters (code points), as the API does, not UTF-16 units: an emoji is one. */
  function highlightNode(hl) {
    const p = el('p', { class: 'hl', dataset: { field: hl.field || '' } });
    const chars = Array.from(String(hl.text || ''));
    const part = (from, to) => chars.slice(from, to).join('');
    let at = 0;
    for (const [start, end] of hl.marks || []) {
      if (start < at || end <= start || end > chars.length) continue;
      p.append(part(at, start), el('mark', {}, part(start, end)));
      at = end;
    }
    p.append(part(at));
    if (hl.field) p.prepend(el('span', { class: 'field' }, `${hl.field}: `));
    return p;
  }

  // ------------------------------------------------------------------ live progress
  // job id -> the upload rows following it: identical bytes dropped twice return the same image and
  // job (SPEC §4.1), and every one of their rows must finish with it
  const tracked = new Map();
  const live = { mode: null, pollTimer: null, safetyTimer: null, source: null, cursor: 0 };

  function setMode(text, mode) {
    live.mode = mode;
    const node = $('#live-mode');
    if (node) {
      node.textContent = text;
      node.dataset.mode = mode;
    }
  }

  async function startLive() {
    const first = await api(`/api/v1/events?after=0&limit=${EVENTS_PAGE}&wait=0`);
    if (first.status === 404) return usePolling('polling job status (this server has no event stream)');
    if (!first.ok || !first.body || !Array.isArray(first.body.events)) {
      return usePolling(`polling job status (event stream: ${errorText(first)})`);
    }
    // Start the stream at the newest event: only what happens after the page loaded matters here.
    let page = first.body;
    for (let pages = 1; page.events.length >= EVENTS_PAGE && pages < 50; pages++) {
      const next = await api(`/api/v1/events?after=${encodeURIComponent(page.last_id)}&limit=${EVENTS_PAGE}&wait=0`);
      if (!next.ok || !next.body || !Array.isArray(next.body.events)) break;
      page = next.body;
    }
    openStream(page.last_id ?? 0);
  }

  function openStream(after) {
    const source = new EventSource(`/api/v1/events?after=${encodeURIComponent(after)}`);
    live.source = source;
    const onMessage = (ev) => {
      let data;
      try { data = JSON.parse(ev.data); } catch (_) { return; }
      onEvent(data, ev.type);
    };
    for (const type of EVENT_TYPES) source.addEventListener(type, onMessage);
    // Retention passed the stream's cursor (a reconnect after a long absence): events may be
    // missing, so ask for every tracked job now rather than at the next safety poll.
    source.addEventListener('events.expired', () => pollTracked(tracked.size));
    source.onmessage = onMessage;
    source.onopen = () => setMode('live: event stream (SSE)', 'events');
    source.onerror = () => {
      if (source.readyState === EventSource.CLOSED) {
        source.close();
        usePolling('polling job status (the event stream closed)');
      }
    };
    setMode('connecting to the event stream…', 'connecting');
    // A missed event (a reconnect past the server's retention, say) must not leave a row spinning.
    live.safetyTimer = setInterval(() => pollTracked(SAFETY_POLL_BATCH), SAFETY_POLL_MS);
  }

  function onEvent(event, sseType) {
    const type = event.type || sseType || '';
    if (type.startsWith('job.') && event.job_id && tracked.has(String(event.job_id))) {
      const status = (event.payload && event.payload.status) || type.slice(4);
      if (TERMINAL.has(status)) refreshJob(String(event.job_id), status);
    } else if (type === 'image.deleted' && event.image_id) {
      document.querySelectorAll(`.card[data-image-id="${CSS.escape(String(event.image_id))}"]`)
        .forEach((n) => n.remove());
    }
  }

  function usePolling(text) {
    if (live.mode === 'poll') return;
    if (live.safetyTimer) clearInterval(live.safetyTimer);
    setMode(text, 'poll');
    live.pollTimer = setInterval(() => pollTracked(POLL_BATCH), POLL_MS);
  }

  let pollBusy = false;
  async function pollTracked(max) {
    if (pollBusy || tracked.size === 0) return;
    pollBusy = true;
    try {
      const ids = [...tracked.keys()].slice(0, max);
      await Promise.all(ids.map(async (jobId) => {
        const r = await api(`/api/v1/jobs/${encodeURIComponent(jobId)}`);
        const rows = tracked.get(jobId);
        if (!rows) return;
        if (r.status === 404) return rows.forEach((row) => finish(row, 'failed', 'the job is gone (image deleted?)'));
        tracked.delete(jobId); // round robin: re-queued at the end unless finished
        if (r.ok) rows.forEach((row) => showJob(row, r.body));
        if (r.ok && TERMINAL.has(r.body.status)) return;
        tracked.set(jobId, rows);
      }));
    } finally {
      pollBusy = false;
    }
  }

  async function refreshJob(jobId, status) {
    const rows = tracked.get(jobId) || [];
    tracked.delete(jobId);
    const r = await api(`/api/v1/jobs/${encodeURIComponent(jobId)}`);
    for (const row of rows) {
      if (r.ok) showJob(row, r.body);
      else finish(row, status);
    }
  }

  function track(jobId, row) {
    const rows = tracked.get(jobId);
    if (!rows) tracked.set(jobId, [row]);
    else if (!rows.includes(row)) rows.push(row);
  }

  /** Show a job's state on its row; a terminal job finishes the row, and one the image's change
   * ended (superseded, target_changed) hands the row to the image's newer job. */
  function showJob(row, job) {
    if (REPLACED.has(job.status) && job.image_id) return followSuccessor(row, job);
    if (TERMINAL.has(job.status)) {
      const err = job.error && job.error.code ? `${job.error.code}: ${job.error.message || ''}` : '';
      return finish(row, job.status, err);
    }
    setGridChip(row, job.status);
    const pct = Math.round((job.progress || 0) * 100);
    setRow(row, job.status === 'queued' ? 'queued' : 'processing',
      job.current_stage ? `${job.status} · ${job.current_stage}` : job.status, 50 + pct / 2);
  }

  /** The row's job ended because its image changed (a context edit, new content): follow the
   * image's latest job instead, or finish with the ended one when there is none newer. */
  async function followSuccessor(row, job) {
    const r = await api(`/api/v1/images/${encodeURIComponent(job.image_id)}`);
    const next = r.ok && r.body ? r.body.latest_job : null;
    if (!next || String(next.id) === String(job.id)) {
      return finish(row, job.status, job.error && job.error.message ? job.error.message : '');
    }
    row.dataset.jobId = next.id;
    if (TERMINAL.has(next.status)) {
      const j = await api(`/api/v1/jobs/${encodeURIComponent(next.id)}`);
      return j.ok ? showJob(row, j.body) : finish(row, next.status);
    }
    track(String(next.id), row);
    setGridChip(row, next.status);
    setRow(row, 'queued', `${job.status.replace('_', ' ')} — following the image's new job`, 50);
  }

  function finish(row, status, detail = '') {
    for (const [id, rows] of tracked) {
      const left = rows.filter((r) => r !== row);
      if (!left.length) tracked.delete(id);
      else if (left.length < rows.length) tracked.set(id, left);
    }
    // ended on purpose (a cancel, the image changed), not a failure
    const state = status === 'succeeded' ? 'done' : (status === 'cancelled' || REPLACED.has(status) ? 'ended' : 'failed');
    if (status === 'succeeded') setRow(row, 'done', 'done', 100);
    else setRow(row, state, detail ? `${status} — ${detail}` : status, 100);
    setGridChip(row, status);
  }

  /** The job status chip of this row's image in the grid. */
  function setGridChip(row, status) {
    const imageId = row.dataset.imageId;
    if (!imageId) return;
    document.querySelectorAll(`#library-grid .card[data-image-id="${CSS.escape(imageId)}"] .chip`)
      .forEach((chip) => { chip.textContent = status; chip.className = `chip s-${status}`; });
  }

  function setRow(row, state, text, percent) {
    row.dataset.state = state;
    $('.state', row).textContent = text;
    $('.state', row).title = text;
    if (percent !== undefined) $('progress', row).value = percent;
  }

  // ------------------------------------------------------------------ uploads
  const queue = [];
  let active = 0;

  function addFiles(files) {
    const list = $('#uploads');
    for (const file of files) {
      const row = el('li', { class: 'up', dataset: { state: 'waiting', name: file.name } },
        el('span', { class: 'fname' }, file.name), el('progress', { max: 100, value: 0 }),
        el('span', { class: 'state' }, 'waiting'));
      list.append(row);
      queue.push({ file, row });
    }
    pump();
  }

  function pump() {
    while (active < UPLOAD_CONCURRENCY && queue.length) {
      const item = queue.shift();
      active++;
      upload(item).finally(() => { active--; pump(); });
    }
  }

  /** One upload through POST /api/v1/images, with byte progress (XHR: fetch has none for uploads). */
  function upload({ file, row }) {
    return new Promise((resolve) => {
      const form = new FormData();
      form.append('file', file, file.name);
      form.append('display_name', file.name.slice(0, 500));
      const xhr = new XMLHttpRequest();
      xhr.open('POST', '/api/v1/images');
      xhr.setRequestHeader('Accept', 'application/json');
      for (const [k, v] of Object.entries(csrfHeaders())) xhr.setRequestHeader(k, v);
      setRow(row, 'uploading', 'uploading', 0);
      xhr.upload.onprogress = (ev) => {
        if (!ev.lengthComputable) return;
        const text = ev.loaded < ev.total ? `uploading ${Math.round(ev.loaded / ev.total * 100)}%` : 'validating…';
        setRow(row, 'uploading', text, ev.loaded / ev.total * 40);
      };
      xhr.onerror = () => { setRow(row, 'failed', 'upload failed: network error', 100); resolve(); };
      xhr.onload = () => {
        let body = null;
        try { body = JSON.parse(xhr.responseText); } catch (_) { body = null; }
        if (xhr.status !== 200 && xhr.status !== 201) {
          setRow(row, 'failed', errorText({ status: xhr.status, body }), 100);
          return resolve();
        }
        uploaded(row, body, xhr.status === 201);
        resolve();
      };
      xhr.send(form);
    });
  }

  function uploaded(row, body, created) {
    const { image, job } = body;
    row.dataset.imageId = image.id;
    const link = el('a', { href: imageUrl(image.id), class: 'open' }, 'open');
    row.append(' ', link);
    addToGrid(image, job && job.status, created);
    if (!job) return setRow(row, 'done', created ? 'stored (not processed)' : 'already in the library', 100);
    row.dataset.jobId = job.id;
    if (TERMINAL.has(job.status)) return showJob(row, job);
    track(String(job.id), row);
    setRow(row, 'queued', created ? 'queued' : 'queued (already in the library)', 50);
  }

  function addToGrid(image, status, created) {
    const grid = $('#library-grid');
    if (!grid) return;
    const empty = $('#empty');
    if (empty) empty.remove();
    const existing = grid.querySelectorAll(`.card[data-image-id="${CSS.escape(image.id)}"]`);
    existing.forEach((n) => n.remove());
    grid.prepend(card(image, { status }));
    const shown = $('#library-shown');
    const total = $('#library-total');
    if (shown) shown.textContent = String(grid.querySelectorAll('.card').length);
    if (total && created && !existing.length) total.textContent = String(Number(total.textContent || 0) + 1);
  }

  function setupUploads() {
    const drop = $('#drop');
    const input = $('#files');
    if (!drop || !input) return;
    input.addEventListener('change', () => { addFiles([...input.files]); input.value = ''; });
    for (const type of ['dragenter', 'dragover']) {
      drop.addEventListener(type, (ev) => { ev.preventDefault(); drop.classList.add('over'); });
    }
    drop.addEventListener('dragleave', () => drop.classList.remove('over'));
    drop.addEventListener('drop', (ev) => {
      ev.preventDefault();
      drop.classList.remove('over');
      const files = [...(ev.dataTransfer ? ev.dataTransfer.files : [])];
      if (files.length) addFiles(files);
    });
    // a file dropped anywhere else must not navigate away from the page
    window.addEventListener('dragover', (ev) => ev.preventDefault());
    window.addEventListener('drop', (ev) => ev.preventDefault());
  }

  // ------------------------------------------------------------------ search and look-alikes
  function showResults(title, hits, status) {
    const section = $('#results');
    $('#results-title').textContent = title;
    const grid = $('#results-grid');
    grid.replaceChildren(...hits.map((h) => card(h.image, { score: h.score, highlight: h.highlight })));
    if (!hits.length) grid.append(el('p', { class: 'empty' }, 'Nothing found.'));
    $('#search-status').textContent = status || '';
    section.hidden = false;
    section.dataset.count = String(hits.length);
  }

  async function searchText(q) {
    const url = new URL(location.href);
    url.searchParams.delete('like');
    url.searchParams.set('q', q);
    history.replaceState(null, '', url);
    $('#search-status').textContent = 'searching…';
    const r = await api(`/api/v1/search/text?${new URLSearchParams({ q, limit: '40' })}`);
    if (!r.ok) {
      $('#search-status').textContent = errorText(r);
      return;
    }
    const cov = r.body.coverage || {};
    showResults(`Results for “${q}”`, r.body.items || [],
      `${(r.body.items || []).length} hits · ${r.body.mode || 'hybrid'} · ${cov.ready ?? '?'} of ${cov.total ?? '?'} images searchable`);
  }

  async function lookAlikes(imageId, name) {
    const url = new URL(location.href);
    url.searchParams.delete('q');
    url.searchParams.set('like', imageId);
    history.replaceState(null, '', url);
    $('#search-status').textContent = 'looking for look-alikes…';
    const r = await api('/api/v1/search/visual', { method: 'POST', json: { image_id: imageId, limit: 24 } });
    if (!r.ok) {
      $('#search-status').textContent = errorText(r);
      return;
    }
    showResults(`Look-alikes of ${name || imageId}`, r.body.items || [], `${(r.body.items || []).length} images by visual similarity`);
    $('#results').dataset.like = imageId;
  }

  function setupSearch() {
    const form = $('#search');
    if (!form) return;
    form.addEventListener('submit', (ev) => {
      ev.preventDefault();
      const q = $('#q').value.trim();
      if (q) searchText(q);
    });
    document.addEventListener('click', (ev) => {
      const btn = ev.target.closest('button.lookalike');
      if (!btn) return;
      const cardNode = btn.closest('.card');
      const name = cardNode ? ($('.name', cardNode) || {}).textContent : '';
      lookAlikes(btn.dataset.imageId, name);
    });
    const params = new URLSearchParams(location.search);
    if (params.get('q')) {
      $('#q').value = params.get('q');
      searchText(params.get('q'));
    } else if (params.get('like')) {
      lookAlikes(params.get('like'));
    }
  }

  // ------------------------------------------------------------------ the image page
  function setupImagePage() {
    const form = $('#context-form');
    if (!form) return;
    const imageId = form.dataset.imageId;
    const message = $('#context-message');
    // A one-line input drops a stored name's line breaks (and the form trims it): a name the user
    // did not touch is not sent, so saving the context never renames the image.
    const nameAsLoaded = form.elements.display_name.value;
    // Likewise the context: sent only when a field of it changed. A human edit wins over the agent
    // for good, so an image renamed before its OCR ran must not get an empty "edited" context (its
    // OCR would then never run).
    const value = (name) => form.elements[name].value;
    // one tag a line: a tag may hold a comma (",", "，"); the API drops empty and repeated tags
    const contextOf = () => ({
      title: value('title'), description: value('description'), ocr_text: value('ocr_text'),
      tags: value('tags').split('\n').map((t) => t.trim()).filter(Boolean),
    });
    const contextAsLoaded = JSON.stringify(contextOf());
    form.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      const body = {};
      if (JSON.stringify(contextOf()) !== contextAsLoaded) body.context = contextOf();
      if (value('display_name') !== nameAsLoaded) body.display_name = value('display_name').trim() || null;
      if (!Object.keys(body).length) {
        message.textContent = 'nothing changed';
        form.dataset.state = 'unchanged';
        return;
      }
      message.textContent = 'saving…';
      form.dataset.state = 'saving';
      const r = await api(`/api/v1/images/${encodeURIComponent(imageId)}`, { method: 'PATCH', json: body });
      if (!r.ok) {
        message.textContent = errorText(r);
        form.dataset.state = 'error';
        return;
      }
      const job = r.body.job;
      message.textContent = job ? `saved — job rev ${job.revision} re-embeds the text (${job.status})` : 'saved';
      // 'saved': the page stays and follows the job; 'reloading': this document is about to go
      if (job && !TERMINAL.has(job.status)) {
        form.dataset.state = 'saved';
        followJob(job.id);
      } else {
        form.dataset.state = 'reloading';
        reloadTimeline();
      }
    });
    const timeline = $('#timeline');
    if (timeline && timeline.dataset.jobId && !TERMINAL.has(timeline.dataset.jobStatus)) {
      followJob(timeline.dataset.jobId);
    }
  }

  /** Poll one job until it is terminal, then reload the page (server-rendered timeline). */
  function followJob(jobId) {
    const timer = setInterval(async () => {
      const r = await api(`/api/v1/jobs/${encodeURIComponent(jobId)}`);
      if (!r.ok || TERMINAL.has(r.body.status)) {
        clearInterval(timer);
        reloadTimeline();
      }
    }, POLL_MS);
  }

  function reloadTimeline() {
    const url = new URL(location.href);
    url.searchParams.set('updated', String(Date.now()));
    location.replace(url);
  }

  // A thumbnail the server cannot make (a corrupt stored file: 422) shows "no preview", not a broken image.
  document.addEventListener('error', (ev) => {
    const box = ev.target && ev.target.tagName === 'IMG' ? ev.target.closest('.thumb') : null;
    if (box) box.classList.add('broken');
  }, true);

  document.addEventListener('DOMContentLoaded', () => {
    if ($('#upload')) {
      setupUploads();
      startLive();
    }
    setupSearch();
    setupImagePage();
    document.body.dataset.ready = '1';
  });
})();
