// Instance list: refresh the rows whenever the server pushes a status change.
(function () {
  const state = document.getElementById("live-state");
  let delay = 1000;
  function connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const base = document.querySelector('meta[name="websocket-url"]').content || `${scheme}://${location.host}`;
    const socket = new WebSocket(`${base}/ws/instances/`);
    socket.onopen = () => {
      state.textContent = gettext("Live updates: on");
      delay = 1000;
      // A change between the page's render and this subscription would be missed: refresh once now.
      document.body.dispatchEvent(new Event("instances-changed"));
    };
    socket.onmessage = () => document.body.dispatchEvent(new Event("instances-changed"));
    socket.onclose = () => {
      state.textContent = gettext("Live updates: reconnecting…");
      setTimeout(connect, delay);
      delay = Math.min(delay * 2, 30000);
    };
  }
  connect();
})();
