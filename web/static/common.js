/* Shared helpers: the CSRF token for fetch/XHR writes, and a small DOM builder that only
   ever sets text (model output and file names are never parsed as HTML). */
"use strict";
window.vidlora = {
  csrf: function () {
    var meta = document.querySelector('meta[name="csrf-token"]');
    return meta ? meta.getAttribute("content") : "";
  },
  el: function (tag, attrs, children) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) {
      if (k === "text") node.textContent = window.vidlora.visible(attrs[k]);
      else node.setAttribute(k, attrs[k]);
    });
    (children || []).forEach(function (c) { if (c) node.appendChild(c); });
    return node;
  },
  // Bidi controls and zero-width characters shown as [U+XXXX], as the server's pages show them
  // (vidlora.visible: its pattern is base.html's data-invisible).
  visible: function (text) {
    var pattern = document.body && document.body.dataset.invisible;
    if (!pattern || typeof text !== "string") return text;
    return text.replace(new RegExp(pattern, "g"), function (c) {
      return "[U+" + c.charCodeAt(0).toString(16).toUpperCase().padStart(4, "0") + "]";
    });
  },
  humanBytes: function (n) {
    var units = ["bytes", "KB", "MB", "GB", "TB"], i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return i === 0 ? n + " bytes" : n.toFixed(1) + " " + units[i];
  },
  // The page's status vocabulary (data-vocabulary, rendered by the server from the same
  // table as the first render): kind "analysis" or "video" -> status -> [label, hint].
  vocabulary: function (root) {
    var words = JSON.parse(root.dataset.vocabulary || "{}");
    return function (kind, status) { return (words[kind] || {})[status] || [status, ""]; };
  },
  // Redraw an outcome bar (macros.html outcome_bar) from analysis counts by status.
  outcomeBar: function (svg, counts) {
    var total = 0, x = 0;
    Object.keys(counts).forEach(function (k) { total += counts[k]; });
    svg.querySelectorAll("rect[data-segment]").forEach(function (rect) {
      var n = counts[rect.dataset.segment] || 0, w = total ? 100 * n / total : 0;
      rect.setAttribute("x", x.toFixed(3));
      rect.setAttribute("width", w.toFixed(3));
      rect.dataset.count = String(n);
      x += w;
    });
    svg.setAttribute("aria-label", (counts.done || 0) + " done, " + (counts.failed || 0) + " failed, " +
                     (counts.rejected || 0) + " not analysable, of " + total);
  },
  ago: function (date, now) {
    var s = Math.max(0, ((now || new Date()) - date) / 1000);
    if (s < 90) return Math.floor(s) + " s ago";
    if (s < 5400) return Math.floor(s / 60) + " min ago";
    if (s < 172800) return Math.floor(s / 3600) + " h ago";
    return Math.floor(s / 86400) + " days ago";
  },
  // <time datetime data-local>: the server writes UTC; show the reader's zone and the age,
  // with the UTC original as the tooltip.
  localTimes: function (root) {
    var fmt = new Intl.DateTimeFormat(undefined, {year: "numeric", month: "short", day: "numeric",
                                                  hour: "2-digit", minute: "2-digit", timeZoneName: "short"});
    (root || document).querySelectorAll("time[datetime][data-local]").forEach(function (t) {
      var d = new Date(t.getAttribute("datetime"));
      if (isNaN(d)) return;
      if (!t.title) t.title = t.textContent;
      t.textContent = fmt.format(d) + " (" + window.vidlora.ago(d) + ")";
    });
  }
};
document.addEventListener("DOMContentLoaded", function () { window.vidlora.localTimes(); });
