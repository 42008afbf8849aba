/* Review page keys: a approve, r reject, e edit (focus the first field), s save the edit,
   j / k next / previous in the review queue. Ignored while typing in a field. */
"use strict";
(function () {
  var form = document.getElementById("review-form");
  if (!form) return;
  function press(action) {
    var button = form.querySelector('button[name="action"][value="' + action + '"]');
    if (button) button.click();
  }
  function follow(id) {
    var link = document.getElementById(id);
    if (link) window.location.href = link.href;
  }
  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey || event.isComposing) return;
    var tag = (event.target.tagName || "").toLowerCase();
    if (tag === "input" || tag === "textarea" || tag === "select" || event.target.isContentEditable) {
      if (event.key === "Escape") event.target.blur();
      return;
    }
    var keys = {
      a: function () { press("approve"); },
      r: function () { press("reject"); },
      s: function () { press("edit"); },
      e: function () {
        var field = form.querySelector("#edit-text, .schema-form input, .schema-form select, .schema-form textarea");
        if (field) field.focus();
      },
      j: function () { follow("queue-next"); },
      k: function () { follow("queue-prev"); }
    };
    if (keys[event.key]) { event.preventDefault(); keys[event.key](); }
  });
})();

/* A review lease (web/review/leases.py): a page opened from the queue holds its answer while
   it is open, renewing every third of the lease, and lets it go when it is left, so the
   queue hands colleagues the next answer. Losing it only shows who has it now. */
(function () {
  var form = document.getElementById("review-form");
  if (!form || !form.dataset.leaseUrl) return;
  var token = (document.querySelector('meta[name="csrf-token"]') || {}).content || "";
  var every = Math.max(5, Number(form.dataset.leaseS) / 3) * 1000;
  var leaving = false;
  function renew() {
    if (leaving) return;
    fetch(form.dataset.leaseUrl, {method: "POST", headers: {"X-CSRFToken": token, "Accept": "application/json"},
                                  credentials: "same-origin"})
      .then(function (response) { return response.status === 409 ? response.json() : null; })
      .then(function (body) {
        if (!body || document.querySelector("[data-testid=lease-holder]")) return;
        var note = document.createElement("p");
        note.className = "notice";
        note.setAttribute("role", "status");
        note.dataset.testid = "lease-holder";
        note.textContent = body.detail + " You can still review it.";
        form.parentNode.insertBefore(note, form);
      })
      .catch(function () { /* offline for a moment: the next renewal tries again */ });
  }
  var timer = window.setInterval(renew, every);
  document.addEventListener("visibilitychange", function () { if (document.visibilityState === "visible") renew(); });
  form.addEventListener("submit", function () { leaving = true; });  // the verdict releases it
  window.addEventListener("pagehide", function () {
    window.clearInterval(timer);
    if (leaving) return;
    var data = new FormData();
    data.append("csrf_token", token);
    navigator.sendBeacon(form.dataset.releaseUrl, data);
  });
})();
