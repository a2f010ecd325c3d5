// The log panel (templates/portal/_logs.html): follows ws/logs/<kind>/<id>/ and shows each line as it comes.
// A dropped connection reconnects with after=<the last cursor shown>: no line twice, none lost. The search
// box hides the lines that do not contain its text; "Follow" keeps the view at the newest line and the
// socket open (unticked: the socket closes, and ticking it again resumes after the last line).
(function () {
  const panel = document.querySelector("[data-logs]");
  if (!panel) return;
  const box = panel.querySelector("[data-logs-lines]");
  const state = panel.querySelector("[data-logs-state]");
  const follow = panel.querySelector("[data-logs-follow]");
  const search = panel.querySelector("[data-logs-search]");
  const count = panel.querySelector("[data-logs-count]");
  const ended = panel.querySelector("[data-logs-end]");
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const base = (document.querySelector('meta[name="websocket-url"]') || {}).content || `${scheme}://${location.host}`;
  const MAX_LINES = 20000;  // kept in the page; the download has everything
  let last = null, socket = null, finished = false, retry = 1000, needle = "";

  const setState = (name, text) => { state.dataset.state = name; state.textContent = text; };
  const matches = (text) => !needle || text.toLowerCase().includes(needle);
  const recount = () => {
    const shown = box.querySelectorAll("span:not([hidden])").length;
    count.textContent = needle ? interpolate(ngettext("%s line matches", "%s lines match", shown), [shown]) : "";
  };

  function add(item) {
    const line = document.createElement("span");
    line.className = `l-${item.stream}`;
    line.dataset.n = item.n;
    line.title = item.t;
    line.textContent = item.line + "\n";
    line.hidden = !matches(item.line);
    box.appendChild(line);
    while (box.childElementCount > MAX_LINES) box.firstElementChild.remove();
    last = item.n;
  }

  function connect() {
    if (finished || !follow.checked) return;
    const query = last ? `?after=${encodeURIComponent(last)}` : "?tail=1000";
    socket = new WebSocket(base + panel.dataset.socket + query);
    setState("connecting", gettext("connecting…"));
    socket.onopen = () => { setState("live", gettext("live")); retry = 1000; };
    socket.onmessage = (event) => {
      const item = JSON.parse(event.data);
      if (item.end) {
        finished = true;
        ended.hidden = false;
        ended.textContent = interpolate(gettext("Ended: %s"), [item.end.reason || item.end.status]);
        return;
      }
      const atBottom = box.scrollTop + box.clientHeight >= box.scrollHeight - 4;
      add(item);
      if (follow.checked && atBottom) box.scrollTop = box.scrollHeight;
      if (needle) recount();
    };
    socket.onclose = (event) => {
      socket = null;
      if (finished || event.code === 1000) { setState("ended", gettext("ended")); return; }
      const refused = { 4401: gettext("sign in again"), 4404: gettext("not found"), 4429: gettext("too many sessions open: close one") }[event.code];
      if (refused) { setState("refused", refused); return; }
      if (!follow.checked) { setState("paused", gettext("paused")); return; }
      setState("reconnecting", gettext("reconnecting…"));
      setTimeout(connect, retry);
      retry = Math.min(retry * 2, 15000);
    };
  }

  follow.addEventListener("change", () => {
    if (follow.checked) { box.scrollTop = box.scrollHeight; if (!socket) connect(); }
    else if (socket) socket.close();
  });
  search.addEventListener("input", () => {
    needle = search.value.trim().toLowerCase();
    for (const line of box.children) line.hidden = !matches(line.textContent);
    recount();
  });
  connect();
})();
