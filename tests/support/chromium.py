"""A real headless Chromium driven over the DevTools protocol (``--remote-debugging-pipe``).

No driver package: Chromium reads JSON commands from fd 3 and writes replies and events to fd 4,
each message ended by a NUL byte. Enough of the protocol for page tests: open a tab, navigate, run
JavaScript, type, read cookies, record every request and CSP violation, take screenshots. Every
wait has a deadline. Name resolution is pinned to loopback (``--host-resolver-rules``), so a page
that reaches for a CDN fails here as it would on an offline machine.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

OFFLINE_RESOLVER = "MAP * ~NOTFOUND, EXCLUDE 127.0.0.1, EXCLUDE localhost"
# Runs before any page script (and outside the page's CSP): remember what the CSP blocked.
RECORD_CSP_VIOLATIONS = (
    "window.__csp = []; document.addEventListener('securitypolicyviolation', "
    "e => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI));"
)


# Page.click's probe: once the page has rendered a frame, the element's centre if a click there would
# hit the element (else null: poll again), with a capture listener that marks the click as seen.
ARM_CLICK = """(async () => {
  const el = document.querySelector(SELECTOR);
  if (!el) return null;
  el.scrollIntoView({block: 'center'});
  await new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)));
  const r = el.getBoundingClientRect(), x = r.x + r.width / 2, y = r.y + r.height / 2;
  const hit = document.elementFromPoint(x, y);
  if (!hit || !(hit === el || el.contains(hit))) return null;
  if (!window.__mfClickListener) {
    window.__mfClickListener = true;
    window.addEventListener('click', () => { window.__mfClicked = true; }, true);
  }
  window.__mfClickToken = TOKEN;
  window.__mfClicked = false;
  return [x, y];
})()"""


def chromium_executable() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe, "chromium is required: run `bash scripts/system-deps.sh` (installs the Debian package)"
    return exe


class CdpError(RuntimeError):
    """Chromium answered a command with an error, or did not answer in time."""


class Browser:
    """One headless Chromium process with its own profile; use as a context manager."""

    def __init__(self, profile_dir: Path, *args: str, timeout: float = 30.0) -> None:
        self.timeout = timeout
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()

        def wire_pipes() -> None:  # in the child: the protocol's fixed descriptors
            os.dup2(to_chrome_r, 3)
            os.dup2(from_chrome_w, 4)

        cmd = [
            chromium_executable(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--disable-dev-shm-usage", "--remote-debugging-pipe",
            # no old page kept on screen (and input dropped) until a same-origin navigation's first paint
            "--disable-features=PaintHolding",
            f"--host-resolver-rules={OFFLINE_RESOLVER}", f"--user-data-dir={profile_dir}", *args, "about:blank",
        ]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, preexec_fn=wire_pipes, pass_fds=(3, 4))
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._next_id = 0
        self._lock = threading.Condition()
        self._replies: dict[int, dict] = {}
        self.events: list[dict] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(self._from_chrome, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                with self._lock:
                    self._lock.notify_all()
                return
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                with self._lock:
                    if "id" in msg:
                        self._replies[msg["id"]] = msg
                    else:
                        self.events.append(msg)
                    self._lock.notify_all()

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        """Send one command and wait for its reply (raises :class:`CdpError` on error or time-out)."""
        with self._lock:
            self._next_id += 1
            msg_id = self._next_id
        msg: dict[str, Any] = {"id": msg_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        with self._lock:
            while msg_id not in self._replies:
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise CdpError(f"no reply to {method} within {self.timeout}s")
                self._lock.wait(min(left, 0.5))
            reply = self._replies.pop(msg_id)
        if "error" in reply:
            raise CdpError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def new_page(self) -> Page:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        return Page(self, session)

    def events_since(self, index: int, method: str, session: str) -> list[dict]:
        with self._lock:
            return [e for e in self.events[index:] if e.get("method") == method and e.get("sessionId") == session]

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except (CdpError, OSError):
            pass
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=15)
        for fd in (self._to_chrome, self._from_chrome):
            try:
                os.close(fd)
            except OSError:
                pass

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Page:
    """One tab. Records every request URL and every CSP violation its documents report."""

    def __init__(self, browser: Browser, session: str) -> None:
        self.browser, self.session = browser, session
        for domain in ("Page", "Runtime", "Network"):
            self.send(f"{domain}.enable")
        self.send("Page.addScriptToEvaluateOnNewDocument", {"source": RECORD_CSP_VIOLATIONS})

    def send(self, method: str, params: dict | None = None) -> dict:
        return self.browser.send(method, params, self.session)

    def goto(self, url: str) -> None:
        """Navigate and wait for the load event (of this navigation, not an earlier one)."""
        mark = len(self.browser.events)
        result = self.send("Page.navigate", {"url": url})
        if result.get("errorText"):
            raise CdpError(f"navigation to {url} failed: {result['errorText']}")
        self.wait_for_event("Page.loadEventFired", mark)

    def wait_for_event(self, method: str, since: int, timeout: float | None = None) -> dict:
        deadline = time.monotonic() + (timeout or self.browser.timeout)
        while time.monotonic() < deadline:
            found = self.browser.events_since(since, method, self.session)
            if found:
                return found[0]
            time.sleep(0.02)
        raise CdpError(f"no {method} within the deadline")

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True})
        if "exceptionDetails" in result:
            raise CdpError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_until(self, expression: str, timeout: float | None = None) -> Any:
        """Poll a JavaScript expression until it is truthy (navigation in between is fine)."""
        deadline = time.monotonic() + (timeout or self.browser.timeout)
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = self.evaluate(expression)
            except CdpError:  # the page is between documents
                last = None
            if last:
                return last
            time.sleep(0.05)
        raise CdpError(f"never true: {expression} (last value {last!r}, at {self.url()})")

    def url(self) -> str:
        try:
            return self.evaluate("location.href")
        except CdpError:
            return "?"

    def type_into(self, selector: str, text: str) -> None:
        """Focus an input and insert text as a paste would."""
        self.evaluate(f"document.querySelector({json.dumps(selector)}).focus()")
        self.send("Input.insertText", {"text": text})

    def click(self, selector: str, timeout: float | None = None) -> None:
        """A real mouse click at the centre of the element, repeated until the page has seen it.

        A user's click can miss. Chromium may drop input that reaches a document before its first
        paint (after a same-origin navigation the old page stays on screen until then), and a box measured
        before a layout shift, or under an overlay, is not the element. So the element is measured
        after a rendered frame and only when a click at its centre would hit it. The click counts
        as delivered when a capture listener of its document saw it, or when that document is gone
        (the click navigated). Only an undelivered click is sent again, so nothing is clicked twice.
        """
        deadline = time.monotonic() + (timeout or self.browser.timeout)
        self.send("Page.bringToFront")  # a user clicks in the tab on screen (a hidden one renders no frames)
        token = uuid.uuid4().hex
        arm = ARM_CLICK.replace("SELECTOR", json.dumps(selector)).replace("TOKEN", json.dumps(token))
        while True:
            box = self.wait_until(arm, timeout=max(0.1, deadline - time.monotonic()))
            for kind in ("mousePressed", "mouseReleased"):
                self.send("Input.dispatchMouseEvent", {"type": kind, "x": box[0], "y": box[1], "button": "left",
                                                       "clickCount": 1})
            try:
                if self.evaluate(f"window.__mfClickToken !== {json.dumps(token)} || window.__mfClicked === true"):
                    return
            except CdpError:  # the page is between documents: the click navigated
                return
            if time.monotonic() > deadline:
                raise CdpError(f"a click on {selector} never reached the page")

    def drop_files(self, selector: str, files: list[tuple[str, str, bytes]]) -> None:
        """Drop ``(name, media type, bytes)`` files on an element as a user would: dragenter,
        dragover and drop events whose DataTransfer holds real File objects."""
        payload = [{"name": n, "type": t, "b64": base64.b64encode(b).decode()} for n, t, b in files]
        self.evaluate(f"""(() => {{
            const dt = new DataTransfer();
            for (const f of {json.dumps(payload)}) {{
                const bytes = Uint8Array.from(atob(f.b64), c => c.charCodeAt(0));
                dt.items.add(new File([bytes], f.name, {{type: f.type}}));
            }}
            const zone = document.querySelector({json.dumps(selector)});
            for (const type of ['dragenter', 'dragover', 'drop'])
                zone.dispatchEvent(new DragEvent(type, {{dataTransfer: dt, bubbles: true, cancelable: true}}));
        }})()""")

    def set_input_files(self, selector: str, paths: list[str]) -> None:
        """Choose files in an ``<input type=file>`` (fires its change event)."""
        doc = self.send("DOM.getDocument")["root"]["nodeId"]
        node = self.send("DOM.querySelector", {"nodeId": doc, "selector": selector})["nodeId"]
        self.send("DOM.setFileInputFiles", {"nodeId": node, "files": paths})

    def cookies(self) -> list[dict]:
        return self.send("Network.getCookies")["cookies"]

    def requested_urls(self) -> list[str]:
        return [e["params"]["request"]["url"]
                for e in self.browser.events_since(0, "Network.requestWillBeSent", self.session)]

    def csp_violations(self) -> list[str]:
        return self.evaluate("window.__csp || []")

    def screenshot(self, path: Path, width: int = 1280, height: int = 900) -> None:
        self.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1,
                                                         "mobile": False})
        data = self.send("Page.captureScreenshot", {"format": "png"})["data"]
        path.write_bytes(base64.b64decode(data))
