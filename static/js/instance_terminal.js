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
  // Text frames are the platform's ({"exit_code": N} before the close); the shell's output is binary.
  socket.onmessage = (event) => typeof event.data === "string" || term.write(new Uint8Array(event.data));
  socket.onclose = (event) => {
    const why = { 4401: gettext("sign in again"), 4404: gettext("no such instance of yours"), 4409: gettext("the instance is not running"),
      4429: gettext("too many terminal and file sessions open: close one") }[event.code];
    conn.dataset.state = event.code === 4000 ? "reconnecting" : "refused";
    conn.textContent = gettext("closed") + (why ? `: ${why}` : event.reason ? `: ${event.reason}` : "");
    term.write(`\r\n\x1b[33m[${conn.textContent}]\x1b[0m\r\n`);
  };
  term.onData((data) => send({ type: "input", data }));
  window.addEventListener("resize", resize);
})();
