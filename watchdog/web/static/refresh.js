// agent-watchdog web: refresh the numbers without a reload. Served as a file (the CSP forbids
// inline script); it only ever sets text with textContent: agent and tool names are a writer's.
"use strict";
(function () {
  var body = document.body;
  var api = body.getAttribute("data-api");
  if (!api) { return; }
  var every = Math.max(1, Number(body.getAttribute("data-refresh-s") || "5")) * 1000;
  var stamp = document.getElementById("refreshed");
  var notice = document.getElementById("notice");

  function text(key, rec) {
    var v = rec[key];
    if (key === "top_tool") {
      if (!v) { return "-"; }
      return v.name + " \u00d7" + v.calls + (v.errors ? " (" + v.errors + " errors)" : "");
    }
    if (v === null || v === undefined) { return "-"; }
    if (key === "cost_eur") { return Number(v).toFixed(4); }
    if (key === "duration_s") { return Number(v).toFixed(0); }
    if (key === "ended_at") { return String(v).replace("T", " ").slice(0, 19); }
    return String(v);
  }

  function apply(rec, row) {
    var cells = row.querySelectorAll("[data-k]");
    for (var i = 0; i < cells.length; i++) {
      var key = cells[i].getAttribute("data-k");
      if (Object.prototype.hasOwnProperty.call(rec, key)) { cells[i].textContent = text(key, rec); }
    }
  }

  function update(data) {
    var records = Array.isArray(data) ? data : [data];
    var rows = document.querySelectorAll("[data-run]");
    var byId = {};
    for (var i = 0; i < rows.length; i++) { byId[rows[i].getAttribute("data-run")] = rows[i]; }
    var unseen = 0;
    for (var j = 0; j < records.length; j++) {
      var row = byId[records[j].id];
      if (row) { apply(records[j], row); } else { unseen += 1; }
    }
    if (notice) {
      notice.textContent = Array.isArray(data) && unseen ? unseen + " run(s) not on this page yet: reload to see them" : "";
    }
    if (stamp) { stamp.textContent = "updated " + new Date().toLocaleTimeString(); }
  }

  function poll() {
    fetch(api, { headers: { "Accept": "application/json" }, credentials: "same-origin" })
      .then(function (r) { if (!r.ok) { throw new Error(String(r.status)); } return r.json(); })
      .then(update)
      .catch(function (e) { if (stamp) { stamp.textContent = "refresh failed (" + e.message + ")"; } })
      .then(function () { setTimeout(poll, every); });
  }
  setTimeout(poll, every);
}());
