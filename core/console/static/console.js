// loopwarden console: new runs appear without a reload (polls /api/changes every 2 s).
// Rows arrive as HTML the server escaped; nothing from a record is put in the page as code.
(function () {
  "use strict";
  var body = document.body;
  if (!body || !body.hasAttribute("data-poll")) { return; }
  var base = body.getAttribute("data-base") || "/";
  var cursor = parseInt(body.getAttribute("data-cursor") || "-1", 10);
  var table = document.querySelector("#runs-table tbody");
  var overview = document.getElementById("overview");

  function tbodyRows(html) {
    var tmp = document.createElement("tbody");
    tmp.innerHTML = html;
    return tmp.firstElementChild;
  }

  function apply(data) {
    if (table) {
      data.runs.forEach(function (run) {
        if (table.querySelector('tr[data-run-id="' + CSS.escape(run.id) + '"]')) { return; }
        var row = tbodyRows(run.html);
        if (row) { table.insertBefore(row, table.firstChild); }
      });
      var count = document.querySelector("#runs-count b");
      if (count && data.runs.length) { count.textContent = data.total.toLocaleString("en"); }
    }
    if (overview && data.runs.length) {
      var total = document.getElementById("total-runs");
      if (total) { total.textContent = String(data.total); }
      Object.keys(data.terminations).forEach(function (name) {
        var item = overview.querySelector('ul.counts li[data-termination="' + CSS.escape(name) + '"] b');
        if (item) { item.textContent = String(data.terminations[name]); }
      });
    }
    cursor = data.cursor;
  }

  function poll() {
    var url = base + "api/changes?after=" + encodeURIComponent(String(Math.max(cursor, 0)));
    fetch(url, { credentials: "same-origin", cache: "no-store" })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (data) {
        if (!data) { return; }
        if (cursor < 0) { cursor = data.cursor; return; }  // the overview: start from now
        apply(data);
      })
      .catch(function () { /* the console restarted or the network blinked: try again */ })
      .then(function () { window.setTimeout(poll, 2000); });
  }
  window.setTimeout(poll, 2000);
}());
