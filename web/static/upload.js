/* Upload page: drag and drop, type and size checks before sending, one XHR for the whole
   batch with a progress bar per file (bytes sent are attributed to files in form order). */
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
      c.bar = V.el("progress", {max: "100", value: "0", "data-testid": "file-progress"});
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
    if (bad.length) showError("These are not videos or archives: " + bad.map(function (c) { return c.file.name; }).join(", ") + ". Remove them to continue.");
    else if (size > maxBytes) showError("Together these files are " + V.humanBytes(size) + ", more than the limit of " + form.dataset.maxLabel + " per upload. Send them in smaller groups.");
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

  form.addEventListener("submit", function (e) {
    e.preventDefault();
    if (!chosen.length) return showError("Choose at least one video, or one archive of videos.");
    if (!form.querySelector('input[name="scenarios"]:checked')) return showError("Choose at least one scenario to run.");
    render();
    if (!errorBox.hidden) return;
    var data = new FormData();
    data.append("csrf_token", V.csrf());
    data.append("name", document.getElementById("batch-name").value);
    form.querySelectorAll('input[name="scenarios"]:checked').forEach(function (cb) { data.append("scenarios", cb.value); });
    chosen.forEach(function (c) { data.append("files", c.file, c.file.name); });

    var xhr = new XMLHttpRequest();
    xhr.open("POST", form.action);
    xhr.setRequestHeader("Accept", "application/json");
    xhr.setRequestHeader("X-CSRFToken", V.csrf());
    xhr.upload.addEventListener("progress", function (ev) {
      if (!ev.lengthComputable) return;
      var sent = ev.loaded * (total() / ev.total);  // ignore multipart overhead
      var start = 0;
      chosen.forEach(function (c) {
        var done = Math.max(0, Math.min(c.file.size, sent - start));
        c.bar.value = c.file.size ? Math.round(100 * done / c.file.size) : 100;
        start += c.file.size;
      });
      summary.textContent = "Uploading… " + Math.round(100 * ev.loaded / ev.total) + "%";
    });
    xhr.upload.addEventListener("load", function () { summary.textContent = "Upload complete; starting the batch…"; });
    xhr.addEventListener("load", function () {
      var body = {};
      try { body = JSON.parse(xhr.responseText); } catch (err) { body = {}; }
      if (xhr.status === 201 && body.url) { window.location.assign(body.url); return; }
      submit.disabled = false;
      summary.textContent = "";
      showError(body.detail || ("The upload failed (error " + xhr.status + "). Please try again."));
    });
    xhr.addEventListener("error", function () {
      submit.disabled = false;
      showError("The connection was lost during the upload. Please try again.");
    });
    submit.disabled = true;
    showError("");
    xhr.send(data);
  });
})();
