/* Batch page: redraw the progress grid from status.json every few seconds until finished. */
"use strict";
(function () {
  var V = window.vidlora;
  var root = document.getElementById("batch");
  if (!root || root.dataset.finished === "true") return;
  var url = root.dataset.statusUrl, every = parseInt(root.dataset.pollMs, 10) || 2000;
  var words = V.vocabulary(root);

  function badge(status, reason, isVideo) {
    var w = words(isVideo ? "video" : "analysis", status);
    return V.el("span", {"class": "status status-" + status, "data-status": status,
                         title: reason || w[1], text: w[0]});
  }
  function thumb(video) {
    return video.thumb_url ? V.el("img", {"class": "thumb", alt: "", loading: "lazy", src: video.thumb_url})
                           : V.el("span", {"class": "thumb placeholder", "data-testid": "thumb-placeholder", title: "No frames yet"});
  }
  function row(video, scenarios) {
    var by = {};
    video.analyses.forEach(function (a) { by[a.scenario] = a; });
    var link = V.el("a", {href: video.url}, [thumb(video), V.el("span", {text: video.name})]);
    var cells = [V.el("td", {"class": "video-cell"}, [link]),
                 V.el("td", {}, [badge(video.status, video.reason, true),
                                 video.reason ? V.el("div", {"class": "reason", text: video.reason}) : null])];
    scenarios.forEach(function (s) {
      var a = by[s];
      var shown = a && a.result_url ? V.el("a", {href: a.result_url, "data-testid": "result-link"}, [badge(a.status, a.reason)])
                                    : a ? badge(a.status, a.reason) : null;
      var kids = a ? [shown,
                      a.reason && (a.status === "failed" || a.status === "rejected") ? V.el("div", {"class": "reason", text: a.reason}) : null,
                      a.reused_from ? V.el("div", {"class": "muted reused", "data-testid": "reused-from"}, [
                        document.createTextNode("reused from "), V.el("a", {href: a.reused_url, text: "batch " + a.reused_from})]) : null]
                   : [V.el("span", {"class": "muted", text: "–"})];
      cells.push(V.el("td", {"class": "cell", "data-testid": "cell-" + video.id + "-" + s,
                             "data-scenario": s, "data-status": a ? a.status : "none"}, kids));
    });
    return V.el("tr", {"data-video-id": String(video.id)}, cells);
  }
  function draw(data) {
    var rows = document.getElementById("progress-rows");
    var old = {};
    rows.querySelectorAll("tr").forEach(function (tr) { old[tr.dataset.videoId] = tr; });
    rows.textContent = "";
    data.videos.forEach(function (v) {
      var fresh = row(v, data.scenarios), prev = old[String(v.id)];
      // Keep the old thumbnail element when it already loaded, so pictures do not flicker.
      if (prev) {
        var img = prev.querySelector("img.thumb"), slot = fresh.querySelector("img.thumb");
        if (img && slot && img.naturalWidth) slot.replaceWith(img);
      }
      rows.appendChild(fresh);
    });
    document.getElementById("no-videos").hidden = data.videos.length > 0;
    V.outcomeBar(document.getElementById("batch-bar"), data.counts);
    document.getElementById("batch-counts").textContent = data.outcome;
    var state = document.getElementById("batch-state");
    state.dataset.status = data.finished ? "finished" : data.status;
    // The server's words (vidlora.status.batch_state), as the first render shows them.
    state.textContent = data.state.charAt(0).toUpperCase() + data.state.slice(1) + (data.finished ? "" : "…");
    var members = document.getElementById("member-list");
    members.textContent = "";
    data.rejected.forEach(function (m) {
      members.appendChild(V.el("li", {"data-status": "rejected"}, [V.el("strong", {text: m.label}), document.createTextNode(" — not analysed: " + m.words)]));
    });
    data.skipped.forEach(function (m) {
      members.appendChild(V.el("li", {"data-status": "skipped"}, [V.el("strong", {text: m.label}), document.createTextNode(" — left out: " + m.words)]));
    });
    document.getElementById("not-analysed").hidden = !(data.rejected.length || data.skipped.length);
    root.dataset.finished = data.finished ? "true" : "false";
  }
  function poll() {
    fetch(url, {headers: {Accept: "application/json"}, credentials: "same-origin"})
      .then(function (r) { if (!r.ok) throw new Error(r.status); return r.json(); })
      .then(function (data) {
        draw(data);
        if (!data.finished) setTimeout(poll, every);
      })
      .catch(function () { setTimeout(poll, every * 3); });  // server busy or restarting
  }
  setTimeout(poll, every);
})();
