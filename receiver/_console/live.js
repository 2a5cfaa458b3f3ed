// The live overview's updates: the console's own script (no other is loaded). It subscribes to
// the server-sent events of /live/events and writes each cell's new text; without it the page
// still shows the numbers of the moment, and refreshes itself.
"use strict";
(function () {
  var box = document.querySelector("[data-live-source]");
  if (!box || !window.EventSource) {
    return;
  }
  var cells = {};
  document.querySelectorAll("[data-live]").forEach(function (cell) {
    cells[cell.getAttribute("data-live")] = cell;
  });
  var at = document.getElementById("live-at");
  var source = new EventSource(box.getAttribute("data-live-source"));
  source.addEventListener("stats", function (event) {
    var data = JSON.parse(event.data);
    Object.keys(data.cells).forEach(function (name) {
      var cell = cells[name];
      if (cell && cell.textContent !== data.cells[name]) {
        cell.textContent = data.cells[name];
      }
    });
    if (at) {
      at.textContent = data.at;
    }
    box.setAttribute("data-live-updated", data.at);
  });
})();
