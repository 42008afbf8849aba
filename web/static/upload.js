/* Upload page: drag and drop, type and size checks before sending, then each file sent
   resumably over tus with its own progress bar, and the batch started from the uploads. */
"use strict";
(function () {
  var V = window.vidlora;
  var form = document.getElementById("upload-form");
  if (!form) return;
  var input = document.getElementById("file-input");
  var zone = document.getElementById("dropzone");
  var list = document.getElementById("file-list");
  var summary = document.getElementById("upload-summary");
  var errorBox = document.getElementById("upload-error");
  var submit = document.getElementById("upload-submit");
  var maxBytes = parseInt(form.dataset.maxBytes, 10);
  var accept = form.dataset.accept.split(",");
  var chosen = [];  // {file, row, bar, note}

  // The server's file-name rule (vidlora.ingest.kinds.UNNAMED): ".mp4", "   .mp4", "..mp4".
  var unnamed = new RegExp(form.dataset.unnamed);
  function allowed(name) {
    var lower = name.toLowerCase();
    return !unnamed.test(name) && accept.some(function (s) { return lower.endsWith(s); });
  }
  function showError(text) {
    errorBox.textContent = text;
    errorBox.hidden = !text;
  }
  function total() {
    return chosen.reduce(function (sum, c) { return sum + c.file.size; }, 0);
  }
  function render() {
    list.textContent = "";
    chosen.forEach(function (c, i) {
      var remove = V.el("button", {type: "button", "class": "link", "aria-label": "Remove " + c.file.name, text: "remove"});
      remove.addEventListener("click", function () { chosen.splice(i, 1); render(); });
      c.bar = V.el("progress", {max: "100", value: c.key ? "100" : "0", "data-testid": "file-progress"});
      c.note = V.el("span", {"class": "muted", text: V.humanBytes(c.file.size)});
      c.row = V.el("li", {"data-file": c.file.name}, [
        V.el("span", {"class": "file-name", text: c.file.name}), c.note, c.bar, remove
      ]);
      if (!allowed(c.file.name)) {
        c.row.classList.add("bad");
        c.note.textContent = unnamed.test(c.file.name) ? "no name before its extension, or hidden" : "not a video or archive";
      }
      list.appendChild(c.row);
    });
    var size = total();
    summary.textContent = chosen.length ? chosen.length + " file(s), " + V.humanBytes(size) : "";
    var bad = chosen.filter(function (c) { return !allowed(c.file.name); });
    var big = chosen.filter(function (c) { return c.file.size > maxBytes; });
    if (bad.length) showError("These are not videos or archives: " + bad.map(function (c) { return c.file.name; }).join(", ") + ". Remove them to continue.");
    else if (big.length) showError("Larger than the limit of " + form.dataset.maxLabel + " per file: " + big.map(function (c) { return c.file.name; }).join(", ") + ".");
    else showError("");
  }
  function add(files) {
    Array.prototype.forEach.call(files, function (f) {
      var dup = chosen.some(function (c) { return c.file.name === f.name && c.file.size === f.size; });
      if (!dup) chosen.push({file: f});
    });
    render();
  }

  input.addEventListener("change", function () { add(input.files); input.value = ""; });
  ["dragenter", "dragover"].forEach(function (ev) {
    zone.addEventListener(ev, function (e) { e.preventDefault(); zone.classList.add("over"); });
  });
  ["dragleave", "drop"].forEach(function (ev) {
    zone.addEventListener(ev, function (e) { e.preventDefault(); zone.classList.remove("over"); });
  });
  zone.addEventListener("drop", function (e) { if (e.dataTransfer) add(e.dataTransfer.files); });

  // Each file goes over tus (vendor/tus-js-client) to /api/v1/uploads in chunks; a dropped
  // connection retries, going offline waits for the network, and a reload resumes a file
  // chosen again from the server's offset (the client keeps each file's upload URL by its
  // fingerprint in localStorage). Once every file is complete the batch is asked for by
  // the uploads' keys, and the server ingests them like any upload.
  var RETRY_MS = [0, 1000, 3000, 5000, 10000, 20000, 30000, 60000];
  function detail(err) {
    var res = err && err.originalResponse;
    if (res) {
      try { var body = JSON.parse(res.getBody()); if (body.detail) return body.detail; } catch (e) { /* not JSON */ }
      return "The server refused the upload (error " + res.getStatus() + ").";
    }
    return "The connection was lost during the upload. Choose the same files and press Upload again to continue where it stopped.";
  }
  function sendOne(c) {
    return new Promise(function (resolve, reject) {
      var upload = new window.tus.Upload(c.file, {
        endpoint: form.dataset.tusEndpoint,
        chunkSize: parseInt(form.dataset.chunkBytes, 10),
        retryDelays: RETRY_MS,
        metadata: {filename: c.file.name, filetype: c.file.type},
        headers: {"X-CSRFToken": V.csrf()},
        removeFingerprintOnSuccess: true,
        onProgress: function (sent, size) {
          c.bar.value = size ? Math.round(100 * sent / size) : 100;
          c.note.textContent = V.humanBytes(sent) + " of " + V.humanBytes(size);
        },
        onSuccess: function () { resolve(upload.url.split("/").pop()); },
        onError: function (err) {
          if (!navigator.onLine) {
            // tus-js-client stops retrying while the browser is offline: go on once it is back.
            summary.textContent = "Connection lost; the upload continues when the network is back.";
            window.addEventListener("online", function () { summary.textContent = "Resuming…"; upload.start(); }, {once: true});
            return;
          }
          reject(new Error(detail(err)));
        }
      });
      upload.findPreviousUploads().then(function (previous) {
        if (previous.length) {
          upload.resumeFromPreviousUpload(previous[0]);
          c.row.dataset.resumed = "true";
        }
        upload.start();
      });
    });
  }
  function startBatch(keys) {
    var data = new FormData();
    data.append("csrf_token", V.csrf());
    data.append("name", document.getElementById("batch-name").value);
    form.querySelectorAll('input[name="scenarios"]:checked').forEach(function (cb) { data.append("scenarios", cb.value); });
    keys.forEach(function (k) { data.append("uploads", k); });
    return fetch(form.action, {method: "POST", body: data, headers: {"Accept": "application/json", "X-CSRFToken": V.csrf()}})
      .then(function (res) {
        return res.json().catch(function () { return {}; }).then(function (body) {
          if (res.status === 201 && body.url) return body.url;
          throw new Error(body.detail || ("The batch could not be started (error " + res.status + ")."));
        });
      });
  }

  form.addEventListener("submit", function (e) {
    e.preventDefault();
    if (!chosen.length) return showError("Choose at least one video, or one archive of videos.");
    if (!form.querySelector('input[name="scenarios"]:checked')) return showError("Choose at least one scenario to run.");
    render();
    if (!errorBox.hidden) return;
    submit.disabled = true;
    showError("");
    var keys = [];
    // One file after another: a slow link gives its whole width to the file in flight.
    chosen.reduce(function (previous, c) {
      return previous.then(function () {
        // Sent already in this page (the batch was refused, say for a scenario): not again.
        if (c.key) { keys.push(c.key); return; }
        summary.textContent = "Uploading " + c.file.name + "…";
        return sendOne(c).then(function (key) { c.key = key; keys.push(key); });
      });
    }, Promise.resolve()).then(function () {
      summary.textContent = "Upload complete; starting the batch…";
      return startBatch(keys);
    }).then(function (url) {
      window.location.assign(url);
    }).catch(function (err) {
      submit.disabled = false;
      summary.textContent = "";
      showError(err.message);
    });
  });
})();
