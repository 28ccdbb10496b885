// dueflow admin: refresh <main data-refresh="N"> every N seconds by fetching the same page
// and swapping its <main> in. The pages work without this script (plain links and forms).
(function () {
  "use strict";
  function schedule() {
    var main = document.getElementById("main");
    var seconds = main && Number(main.getAttribute("data-refresh"));
    if (!seconds) { return; }
    window.setTimeout(refresh, seconds * 1000);
  }
  function refresh() {
    fetch(window.location.href, { credentials: "same-origin", cache: "no-store" })
      .then(function (answer) {
        if (!answer.ok || answer.redirected) { throw new Error("stale session"); }
        return answer.text();
      })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("main");
        var main = document.getElementById("main");
        if (fresh && main) {
          main.innerHTML = fresh.innerHTML;
          main.setAttribute("data-refresh", fresh.getAttribute("data-refresh") || "");
        }
        schedule();
      })
      .catch(function () { window.setTimeout(refresh, 10000); });
  }
  document.addEventListener("DOMContentLoaded", schedule);
})();
