/* Batch list: refresh progress of the unfinished batches on the page. */
"use strict";
(function () {
  var table = document.getElementById("batch-list");
  if (!table) return;
  var every = parseInt(table.dataset.pollMs, 10) || 2000;
  function pending() {
    return Array.prototype.filter.call(table.querySelectorAll("tr[data-batch-id]"), function (tr) {
      return tr.dataset.finished !== "true";
    });
  }
  function poll() {
    var rows = pending();
    if (!rows.length) return;
    var ids = rows.map(function (tr) { return tr.dataset.batchId; }).join(",");
    fetch(table.dataset.progressUrl + "?ids=" + ids, {headers: {Accept: "application/json"}, credentials: "same-origin"})
      .then(function (r) { if (!r.ok) throw new Error(r.status); return r.json(); })
      .then(function (data) {
        rows.forEach(function (tr) {
          var s = data[tr.dataset.batchId];
          if (!s) return;
          window.vidlora.outcomeBar(tr.querySelector('[data-role="bar"]'), s.counts);
          tr.querySelector('[data-role="text"]').textContent = s.text;
          var state = tr.querySelector('[data-role="state"]');
          state.dataset.status = s.finished ? "finished" : s.status;
          state.textContent = s.state;  // vidlora.status.batch_state, as the first render
          state.dataset.problems = s.problems;
          if (s.problems) state.appendChild(window.vidlora.el("span", {"class": "status status-failed", "data-role": "problems", text: " " + s.problems + " with problems"}));
          tr.dataset.finished = s.finished ? "true" : "false";
        });
        setTimeout(poll, every);
      })
      .catch(function () { setTimeout(poll, every * 3); });
  }
  setTimeout(poll, every);
})();
