// Web terminal: xterm.js over /ws/terminal/instances/<id>/ (JSON text frames in, binary frames out).
(function () {
  const cfg = JSON.parse(document.getElementById("terminal-config").textContent);
  const conn = document.getElementById("conn");
  const term = new Terminal({ cursorBlink: true, fontSize: 14, convertEol: false, scrollback: 5000 });
  const fit = new FitAddon.FitAddon();
  term.loadAddon(fit);
  term.open(document.getElementById("terminal"));
  fit.fit();
  window.gpucloudTerminal = term;  // for the browser test: what the screen shows

  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const base = document.querySelector('meta[name="websocket-url"]').content || `${scheme}://${location.host}`;
  const socket = new WebSocket(base + cfg.socket);
  socket.binaryType = "arraybuffer";
  const send = (message) => socket.readyState === WebSocket.OPEN && socket.send(JSON.stringify(message));
  const resize = () => { fit.fit(); send({ type: "resize", cols: term.cols, rows: term.rows }); };
  socket.onopen = () => { conn.dataset.state = "live"; conn.textContent = gettext("connected"); resize(); term.focus(); };
  // Text frames are the platform's: {"exit_code": N}, and {"closed": code, "why": ..., "reason": ...} just
  // before it closes (daphne drops a close frame's reason); the shell's output is binary.
  let closing = null;
  socket.onmessage = (event) => {
    if (typeof event.data !== "string") { term.write(new Uint8Array(event.data)); return; }
    try { const said = JSON.parse(event.data); if (said.closed) closing = said; } catch (e) { /* not ours */ }
  };
  socket.onclose = (event) => {
    const refused = { 4401: gettext("sign in again"), 4404: gettext("no such instance of yours"), 4409: gettext("the instance is not running"),
      4429: gettext("too many terminal and file sessions open: close one") }[event.code];
    const ended = closing && { stopped: gettext("the instance stopped"), exited: gettext("the shell exited"),
      ended: gettext("the connection to the instance ended") }[closing.why];
    const why = refused || ended || (closing && closing.reason) || event.reason;
    conn.dataset.state = event.code === 4000 ? "reconnecting" : "refused";
    conn.textContent = gettext("closed") + (why ? `: ${why}` : "");
    conn.dataset.why = closing ? closing.why : "";
    term.write(`\r\n\x1b[33m[${conn.textContent}]\x1b[0m\r\n`);
  };
  term.onData((data) => send({ type: "input", data }));
  window.addEventListener("resize", resize);
})();
