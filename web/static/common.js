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
      if (k === "text") node.textContent = attrs[k];
      else node.setAttribute(k, attrs[k]);
    });
    (children || []).forEach(function (c) { if (c) node.appendChild(c); });
    return node;
  },
  humanBytes: function (n) {
    var units = ["bytes", "KB", "MB", "GB", "TB"], i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return i === 0 ? n + " bytes" : n.toFixed(1) + " " + units[i];
  },
  statusLabel: function (s) {
    return {pending: "queued", ready: "queued", queued: "queued"}[s] || s;
  },
  statusHint: {
    pending: "Waiting for its frames to be sampled",
    ready: "Frames ready; waiting for a GPU worker",
    queued: "Sent to a GPU worker",
    running: "The model is looking at it now",
    done: "Finished", failed: "Failed after retries", rejected: "Not analysable"
  }
};
