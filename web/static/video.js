/* Video page: clicking a frame seeks the player to that moment (a plain link without JS). */
"use strict";
(function () {
  var player = document.getElementById("player");
  if (!player) return;
  document.querySelectorAll("a.frame-link[data-time]").forEach(function (a) {
    a.addEventListener("click", function (e) {
      var t = parseFloat(a.dataset.time);
      if (isNaN(t)) return;
      e.preventDefault();
      player.currentTime = t;
      player.scrollIntoView({behavior: "smooth", block: "center"});
    });
  });
})();
