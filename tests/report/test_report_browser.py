"""The report in a real browser: headless Chromium, no network, driven over the DevTools protocol.

Builds a report from a tiny random LLaMA (``analyze(..., diagnostics=True, bounds=True)``, the
figures of ``tl_geometry.plot`` when it exists plus a few drawn here, and a head grid), opens it
from ``file://`` with the network switched off, and checks that

* nothing was requested from the network (every request is ``file:`` or ``data:``),
* no console error, exception or error log entry appeared,
* every plotly figure rendered (a ``.main-svg`` in each ``.plotly-graph-div``),
* the circuitsvis head grid mounted (its ``div`` has children) and shows the head names,
* the head tiles: one per head with a drawn thumbnail, no label clipped or overflowing its tile,
  circuitsvis' own selector row hidden, a click on a tile enlarging that head,
* no horizontal scroll of the whole page,

at two widths (:data:`WIDTHS`: a laptop and a phone), each a fresh load, and saves a full-page
screenshot of each to ``test-artifacts/report-<width>.png`` (printed; CI keeps them as artifacts).
Nothing waits a fixed time: the load is ``Page.loadEventFired``, the rest a condition the page
evaluates itself (``awaitPromise``), bounded by ``TLG_BROWSER_TIMEOUT`` (default 120 s) only so a
broken page cannot hang CI; a slow machine only waits longer.

Needs Chromium (Debian: ``apt-get install -y --no-install-recommends chromium``); set
``TLG_CHROMIUM`` to use another binary. Without it the test FAILS (it is not skipped). The
DevTools client is ~80 lines of stdlib over ``--remote-debugging-pipe``: no test dependency.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import queue
import re
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go

import tl_geometry as tlg
from tl_geometry.plot.circuitsvis_grid import head_grid
from tl_geometry.plot.head_tiles import TILE_MIN_WIDTH_PX
from tl_geometry.report import build_report, default_figures

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
INSTALL_HINT = "apt-get update && apt-get install -y --no-install-recommends chromium"
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-extensions", "--disable-default-apps", "--mute-audio", "--hide-scrollbars",
    "--no-default-browser-check", "--disable-dev-shm-usage",
    # belt and braces on top of the emulated offline mode: no name resolves, no proxy answers
    "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=http://127.0.0.1:9", "--proxy-bypass-list=<-loopback>",
    "--window-size=1280,1600", "--remote-debugging-pipe",
]  # fmt: skip
TIMEOUT_S = float(os.environ.get("TLG_BROWSER_TIMEOUT", "120"))
#: Viewport widths the report is checked at (CSS pixels): a laptop and a phone.
WIDTHS = (1280, 420)
#: The viewport is this tall from the start, so that the full-page screenshot needs no resize (and
#: no re-layout to wait for); a screenshot is cut at this height.
SHOT_HEIGHT = 16000


def find_chromium() -> str | None:
    env = os.environ.get("TLG_CHROMIUM")
    if env:
        return env if Path(env).exists() or shutil.which(env) else None
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


class DevTools:
    """A minimal Chrome DevTools Protocol client over ``--remote-debugging-pipe``.

    Chromium reads NUL-terminated JSON messages on fd 3 and writes them on fd 4.
    """

    def __init__(self, binary: str, user_data_dir: str) -> None:
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def place_fds() -> None:  # in the child: the pipe ends become fds 3 and 4
            a = fcntl.fcntl(to_child_r, fcntl.F_DUPFD, 10)
            b = fcntl.fcntl(from_child_w, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)  # dup2 leaves the copies inheritable
            os.dup2(b, 4)
            os.close(a)
            os.close(b)

        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [binary, *CHROMIUM_FLAGS, f"--user-data-dir={user_data_dir}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.stderr,
            # close_fds=False keeps fds 3 and 4 placed by place_fds (Python's own fds are not inheritable)
            preexec_fn=place_fds, close_fds=False,
        )  # fmt: skip
        os.close(to_child_r)
        os.close(from_child_w)
        self._next_id = 0
        self._replies: dict[int, dict] = {}
        self.events: queue.Queue[dict] = queue.Queue()
        self._lock = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(self._from_child, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                with self._lock:
                    self._closed = True
                    self._lock.notify_all()
                return
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                if "id" in msg:
                    with self._lock:
                        self._replies[msg["id"]] = msg
                        self._lock.notify_all()
                else:
                    self.events.put(msg)

    _closed = False

    def send(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 60) -> dict:
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._next_id not in self._replies:
                left = deadline - time.monotonic()
                if self._closed or left <= 0:
                    why = "it exited" if self._closed else "timeout"
                    raise RuntimeError(f"no reply to {method} from chromium ({why}); its stderr:\n"
                                       f"{self.stderr_text()[-3000:]}")  # fmt: skip
                self._lock.wait(left)
            reply = self._replies.pop(self._next_id)
        if "error" in reply:
            raise RuntimeError(f"{method} failed: {reply['error']}")
        return reply.get("result", {})

    def wait_for(self, method: str, timeout: float) -> tuple[bool, list[dict]]:
        """Block until the event ``method`` arrives (True) or ``timeout`` passes (False); every event read."""
        deadline = time.monotonic() + timeout
        seen: list[dict] = []
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or self._closed:
                return False, seen
            try:
                event = self.events.get(timeout=min(left, 5.0))
            except queue.Empty:
                continue
            seen.append(event)
            if event.get("method") == method:
                return True, seen

    def evaluate(self, expression: str, session: str, timeout: float = 60) -> Any:
        """The value of ``expression`` in the page (a promise is awaited)."""
        reply = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True},
                          session=session, timeout=timeout)  # fmt: skip
        if "exceptionDetails" in reply:
            raise RuntimeError(f"the page's script failed: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    def drain(self) -> list[dict]:
        out = []
        while True:
            try:
                out.append(self.events.get_nowait())
            except queue.Empty:
                return out

    def stderr_text(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=10)
        except Exception:  # noqa: BLE001 - fall through to terminate
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for fd in (self._to_child, self._from_child):
            try:
                os.close(fd)
            except OSError:
                pass
        self.stderr.close()


STATE_JS = """(() => {
  const figs = [...document.querySelectorAll('.tlg-figure .plotly-graph-div')];
  const grid = document.querySelector('.tlg-head-grid div[id^="circuits-vis-"]');
  const inked = (c) => {  // a thumbnail with at least one pixel darker than the background
    if (!c || !c.width) return false;
    const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    for (let i = 0; i < d.length; i += 4) if (d[i] < 200) return true;
    return false;
  };
  const tiles = [...document.querySelectorAll('.tlg-head-tiles .tlg-tile')].map(t => {
    const label = t.querySelector('.tlg-tile-label');
    const box = t.parentElement.getBoundingClientRect(), r = t.getBoundingClientRect();
    const l = label.getBoundingClientRect();
    return {
      title: t.title, text: label.innerText, width: r.width,
      clipped: label.scrollWidth > label.clientWidth || label.scrollHeight > label.clientHeight
               || t.scrollWidth > t.clientWidth || t.scrollHeight > t.clientHeight,
      outside: l.left < r.left - 0.5 || l.right > r.right + 0.5 || l.bottom > r.bottom + 0.5
               || r.left < box.left - 0.5 || r.right > box.right + 0.5,
      thumb: inked(t.querySelector('canvas.tlg-thumb')),
    };
  });
  const doc = document.documentElement;
  return {
    figures: figs.map(d => {
      // what a reader cannot see: a legend or title outside the drawn figure, a figure taller than its box
      const svg = d.querySelector('.main-svg'), box = d.closest('.tlg-figure').getBoundingClientRect();
      const s = svg ? svg.getBoundingClientRect() : null;
      const out = (e) => { const r = e.getBoundingClientRect();
        return r.width > 0 && (r.left < s.left - 1 || r.right > s.right + 1 || r.top < s.top - 1 || r.bottom > s.bottom + 1); };
      return {id: d.id, svg: d.querySelectorAll('.main-svg').length, layout: d.dataset.tlgLayout || '',
              legends: d.querySelectorAll('.legend').length,
              cut: s ? [...d.querySelectorAll('.legend, .gtitle')].filter(out).map(e => e.getAttribute('class'))
                       .concat(s.bottom > box.bottom + 1 ? ['figure taller than its box'] : []) : []};
    }),
    gridFound: !!grid,
    // elements React rendered into the mount point (circuitsvis' own <script> may sit inside it)
    gridChildren: grid ? [...grid.children].filter(c => c.tagName !== 'SCRIPT').length : 0,
    gridCanvases: grid ? grid.querySelectorAll('canvas').length : 0,
    gridText: grid ? grid.innerText.slice(0, 4000) : '',
    tilesDrawn: [...document.querySelectorAll('.tlg-head-grid')].every(g => g.dataset.tiles === 'drawn'),
    tiles: tiles,
    // circuitsvis' own selector tiles (h4 labels) still on screen: hidden by the tiles' style
    theirTilesShown: grid ? [...grid.querySelectorAll('h4')].filter(h => h.getClientRects().length).length : -1,
    zoomed: grid ? [...grid.querySelectorAll('h3')].map(h => h.innerText).filter(t => t.endsWith('Zoomed')) : [],
    sideways: doc.scrollWidth > doc.clientWidth,
    widest: [...document.querySelectorAll('main *')].filter(e => e.getBoundingClientRect().right > doc.clientWidth + 0.5)
      .slice(0, 5).map(e => e.tagName + '.' + e.className),
    width: doc.clientWidth,
    height: Math.ceil(document.body.getBoundingClientRect().bottom),
    plotly: typeof window.Plotly,
    pageText: document.body.innerText,
  };
})()"""


def until(condition_js: str, bound_s: float) -> str:
    """A promise (for ``Runtime.evaluate``) of STATE_JS once ``condition_js`` (on ``s``, the state)
    holds and two frames are painted, or of the state when ``bound_s`` passes (``ready: false``)."""
    return f"""new Promise(resolve => {{
  const deadline = performance.now() + {bound_s * 1000:.0f};
  const frames = (n, then) => n ? requestAnimationFrame(() => frames(n - 1, then)) : then();
  const check = () => {{
    const s = {STATE_JS};
    if ({condition_js}) frames(2, () => resolve(Object.assign({STATE_JS}, {{ready: true}})));
    else if (performance.now() > deadline) resolve(Object.assign(s, {{ready: false}}));
    else setTimeout(check, 50);
  }};
  check();
}})"""


RENDERED = "s.figures.every(f => f.svg > 0 && f.layout) && s.gridCanvases > 0 && s.tilesDrawn"


def problems_in(events: list[dict]) -> tuple[list[str], list[str]]:
    """Console errors / exceptions / error log entries, and network requests that are not local."""
    errors, remote = [], []
    for ev in events:
        method, p = ev.get("method"), ev.get("params", {})
        if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            args = " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", []))
            errors.append(f"console.{p['type']}: {args}")
        elif method == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            errors.append(f"exception: {d.get('text')} {d.get('exception', {}).get('description', '')}".strip())
        elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            e = p["entry"]
            errors.append(f"log ({e.get('source')}): {e.get('text')} {e.get('url', '')}".strip())
        elif method == "Network.requestWillBeSent":
            url = p.get("request", {}).get("url", "")
            if not url.startswith(("file:", "data:", "blob:", "about:")):
                remote.append(url)
        elif method == "Network.loadingFailed" and not p.get("canceled"):
            errors.append(f"loading failed: {p.get('errorText')} ({p.get('type')})")
    return errors, remote


def open_report(binary: str, page: Path, screenshots: dict[int, Path]) -> dict[int, dict]:
    """Load ``page`` offline once per width of ``screenshots``, wait until it has rendered, screenshot
    it; per width the state, the events and (first width) the state after clicking the second tile."""
    out: dict[int, dict] = {}
    with tempfile.TemporaryDirectory(prefix="tlg-chromium-") as profile:
        cdp = DevTools(binary, profile)
        try:
            targets = cdp.send("Target.getTargets")["targetInfos"]
            pages = [t for t in targets if t["type"] == "page"]
            if pages:
                target = pages[0]["targetId"]
            else:
                target = cdp.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            session = cdp.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Runtime", "Log", "Network", "Page"):
                cdp.send(f"{domain}.enable", session=session)
            cdp.send("Network.emulateNetworkConditions",
                     {"offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1},
                     session=session)  # fmt: skip
            for width, screenshot in screenshots.items():
                viewport = {"width": width, "height": SHOT_HEIGHT, "deviceScaleFactor": 1, "mobile": False}
                cdp.send("Emulation.setDeviceMetricsOverride", viewport, session=session)
                events = cdp.drain()
                cdp.send("Page.navigate", {"url": page.resolve().as_uri()}, session=session)
                loaded, seen = cdp.wait_for("Page.loadEventFired", TIMEOUT_S)
                events += seen
                state = cdp.evaluate(until(RENDERED, TIMEOUT_S), session, timeout=TIMEOUT_S + 60)
                height = max(600, min(int(state["height"]), SHOT_HEIGHT))
                shot = cdp.send("Page.captureScreenshot",
                                {"format": "png", "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}},
                                session=session, timeout=120)  # fmt: skip
                screenshot.parent.mkdir(parents=True, exist_ok=True)
                screenshot.write_bytes(base64.b64decode(shot["data"]))
                clicked = None
                if not out and len(state["tiles"]) > 1:  # a click on the second tile enlarges its head
                    cdp.evaluate("document.querySelectorAll('.tlg-head-tiles .tlg-tile')[1].click()", session)
                    wanted = json.dumps(state["tiles"][1]["title"] + " Zoomed")
                    clicked = cdp.evaluate(until(f"s.zoomed.includes({wanted})", TIMEOUT_S), session,
                                           timeout=TIMEOUT_S + 60)  # fmt: skip
                events += cdp.drain()
                out[width] = {"loaded": loaded, "state": state, "events": events, "clicked": clicked}
            return out
        finally:
            cdp.close()


def test_report_renders_offline_in_chromium(llama_bridge, tmp_path, capsys) -> None:
    binary = find_chromium()
    assert binary, (
        f"Chromium is needed for this test and was not found (looked for {', '.join(CHROMIUM_NAMES)} and "
        f"$TLG_CHROMIUM). Install it: {INSTALL_HINT}"
    )
    corpus = tlg.corpus.from_texts(["The quick brown fox jumps over the lazy dog. " * 8], n_seqs=2, seq_len=32)
    result = tlg.analyze(llama_bridge, corpus, diagnostics=True, bounds=True, progress=False)
    info = result.model
    regimes = ["Retriever", "Reset", "Mixer", "Unclassified"]
    heads = pd.DataFrame({
        "layer": [layer for layer in range(info.n_layers) for _ in range(info.n_heads)],
        "head": [head for _ in range(info.n_layers) for head in range(info.n_heads)],
        "regime": pd.Categorical([regimes[i % 4] for i in range(info.n_layers * info.n_heads)], categories=regimes),
        # the longest labels a report shows: "L0H3 · Unclassified (nearest: Retriever)"
        "regime_nearest": [regimes[i % 4] if i % 4 < 3 else regimes[i % 3] for i in range(info.n_layers * info.n_heads)],
    })  # fmt: skip
    by_n, env = result.mean_by_n(), result.envelopes()
    ours = [
        ("Precision and recall by N", "means over windows, layers and heads",
         go.Figure([go.Scatter(x=by_n.n, y=by_n.precision, name="precision"),
                    go.Scatter(x=by_n.n, y=by_n.recall, name="recall")])),
        ("Precision envelope", "mean lower / upper envelope",
         go.Figure([go.Scatter(x=env.n, y=env[c], name=c)
                    for c in ("precision_lower", "precision", "precision_upper")]),
         "envelopes"),
        ("Value-norm sink ratio", "per (layer, kv_head)",
         go.Figure(go.Heatmap(z=result.value_norms.pivot(index="layer", columns="kv_head",
                                                           values="sink_ratio").to_numpy())),
         "diagnostics"),
    ]  # fmt: skip
    figures = [f for f in default_figures(result, heads=heads) if f.available] + ours
    grid = head_grid(llama_bridge, "def add(a, b):\n    return a + b  # </script>", heads)
    page = build_report(result, tmp_path / "report", figures=figures, head_grid_html=grid.fragment(), heads=heads)
    screenshots = {width: ARTIFACTS / f"report-{width}.png" for width in WIDTHS}

    t0 = time.perf_counter()
    out = open_report(binary, page, screenshots)
    with capsys.disabled():  # the screenshots' paths belong in the CI log even without -s
        print(f"\nreport: {page} ({page.stat().st_size / 1e6:.1f} MB), rendered in chromium at widths {WIDTHS} in "
              f"{time.perf_counter() - t0:.1f} s (load average {os.getloadavg()[0]:.1f})")  # fmt: skip
        for width, path in screenshots.items():
            print(f"screenshot at {width} px (CI artifact): {path}")

    for width in WIDTHS:
        state, events = out[width]["state"], out[width]["events"]
        errors, remote = problems_in(events)
        assert out[width]["loaded"], f"{width} px: the page never fired its load event"
        assert remote == [], f"{width} px: the page asked the network for {remote}"
        assert errors == [], f"{width} px: console errors:\n" + "\n".join(errors)
        brief = {k: v for k, v in state.items() if k not in ("gridText", "pageText")}
        assert state["ready"], f"{width} px: not rendered within {TIMEOUT_S} s: {brief}"
        assert state["width"] == width
        assert state["plotly"] == "object"
        assert len(state["figures"]) == len(figures) >= 3
        assert [f["id"] for f in state["figures"] if f["svg"] == 0] == [], "plotly figures that did not render"
        # the narrow layout below 640 px (the legend below the plot, the figure grown to hold it), as built wider
        layout = "narrow" if width < 640 else "wide"
        assert [f["id"] for f in state["figures"] if f["layout"] != layout] == [], f"{width} px: not laid out {layout}"
        assert sum(f["legends"] for f in state["figures"]) >= 3, "too few legends to check"
        cut = {f["id"]: f["cut"] for f in state["figures"] if f["cut"]}
        assert cut == {}, f"{width} px: legends or titles cut off: {cut}"
        assert state["gridFound"], "no circuitsvis mount point in the head grid"
        assert state["gridChildren"] > 0, "the circuitsvis head grid did not mount"
        assert state["gridCanvases"] > len(grid.names), "the head grid drew no attention pattern"  # its tiles + zoom
        assert state["zoomed"] == [f"{grid.names[0]} Zoomed"], state["gridText"][:500]
        # the tiles: one per head in grid order ("L0H0 · Retriever", ... sorted by regime), each with its
        # thumbnail, no label clipped or outside its tile
        tiles = state["tiles"]
        assert [t["title"] for t in tiles] == grid.names
        assert [t["text"].split("\n")[0] for t in tiles] == [name.split(" ")[0] for name in grid.names]
        assert all(t["thumb"] for t in tiles), f"{width} px: tiles without a thumbnail"
        assert [t for t in tiles if t["clipped"] or t["outside"]] == [], f"{width} px: clipped tile labels"
        assert min(t["width"] for t in tiles) >= TILE_MIN_WIDTH_PX
        assert state["theirTilesShown"] == 0, "circuitsvis' own selector row is still on screen"
        assert not state["sideways"], f"{width} px: the page scrolls sideways ({state['widest']})"
        assert re.search(r"\bSPEC\b", state["pageText"]) is None, "the page cites the spec, which users never see"
        assert screenshots[width].stat().st_size > 10_000
    clicked = out[WIDTHS[0]]["clicked"]
    assert clicked and clicked["ready"], (
        f"a click on the second tile did not enlarge its head: {clicked and clicked['zoomed']}"
    )
