// dueflow admin: refresh <main data-refresh="N"> every N seconds by fetching the same page
// and swapping its <main> in, unless the pointer is over a form or focus is inside <main>.
// The gate page: Enter in its codes box sends them (a barcode scanner types a code, then
// Enter); Shift+Enter starts a new line, and a paste of several lines stays as it is.
// The pages work without this script (plain links and forms).
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
        // Never move rows under an operator about to press a button, nor drop a reason they
        // have typed and not sent yet: try again later.
        if (main && (main.querySelector("form:hover") || main.contains(document.activeElement) ||
            Array.prototype.some.call(main.querySelectorAll("form input[type=text]"),
              function (field) { return field.value !== ""; }))) {
          schedule();
          return;
        }
        if (fresh && main) {
          main.innerHTML = fresh.innerHTML;
          main.setAttribute("data-refresh", fresh.getAttribute("data-refresh") || "");
        }
        schedule();
      })
      .catch(function () { window.setTimeout(refresh, 10000); });
  }
  function sendCodesOnEnter(event) {
    var box = event.target;
    if (event.key !== "Enter" || event.shiftKey || event.isComposing ||
        !box.matches || !box.matches("#gate-form textarea[name=codes]")) { return; }
    event.preventDefault();  // no new line: the scanner's Enter ends its code
    if (box.value.trim() === "") { return; }
    var form = box.form;
    if (form.requestSubmit) { form.requestSubmit(); } else { form.submit(); }
  }
  document.addEventListener("DOMContentLoaded", schedule);
  document.addEventListener("keydown", sendCodesOnEnter);
})();
