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
