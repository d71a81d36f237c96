/* Live pages of the jobstate console: the Overview, Workers and Queues pages refresh
 * their figures in place every few seconds.
 *
 * Progressive enhancement: a page works without this script (it is current as of its
 * load, and the browser's reload refreshes it). With it, every element marked
 * data-jobstate-live (each with an id) is replaced by the same element of a fresh copy
 * of the page, fetched from the same URL. Nothing is fetched while the tab is hidden
 * (Page Visibility API), nor while the operator has the control switched off, nor
 * while the focus is inside a live region (a button about to be pressed is not pulled
 * away). No dependencies, no build step.
 */
(function () {
  "use strict";

  var control = document.getElementById("jobstate-live");
  if (!control || !window.fetch || !window.DOMParser) {
    return;
  }
  var toggle = document.getElementById("jobstate-live-toggle");
  var status = document.getElementById("jobstate-live-status");
  var interval = parseInt(control.getAttribute("data-jobstate-live-interval"), 10) || 5000;
  var on = true;
  var timer = null;
  var inFlight = false;

  function regions(root) {
    return Array.prototype.slice.call(root.querySelectorAll("[data-jobstate-live][id]"));
  }

  function say(text) {
    status.textContent = text;
  }

  function describe() {
    toggle.textContent = toggle.getAttribute(on ? "data-label-on" : "data-label-off");
    toggle.setAttribute("aria-pressed", on ? "true" : "false");
    say(status.getAttribute(on ? "data-label-on" : "data-label-off"));
  }

  function focusedInside(region) {
    var active = document.activeElement;
    return active && active !== document.body && region.contains(active);
  }

  function refresh() {
    if (!on || document.hidden || inFlight) {
      return;
    }
    inFlight = true;
    fetch(window.location.href, {
      credentials: "same-origin",
      headers: { "X-Requested-With": "jobstate-live" },
    })
      .then(function (response) {
        if (!response.ok) {
          throw new Error(String(response.status));
        }
        return response.text();
      })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html");
        regions(document).forEach(function (region) {
          var replacement = fresh.getElementById(region.id);
          if (replacement && !focusedInside(region)) {
            region.replaceWith(document.importNode(replacement, true));
          }
        });
        say(
          status.getAttribute("data-label-on") + " — " +
          status.getAttribute("data-label-updated") + " " +
          new Date().toLocaleTimeString()
        );
      })
      .catch(function (error) {
        say(status.getAttribute("data-label-on") + " — " + error.message);
      })
      .then(function () {
        inFlight = false;
      });
  }

  function schedule() {
    window.clearInterval(timer);
    timer = null;
    if (on && !document.hidden) {
      timer = window.setInterval(refresh, interval);
    }
  }

  toggle.addEventListener("click", function () {
    on = !on;
    describe();
    schedule();
  });

  document.addEventListener("visibilitychange", function () {
    schedule();
    if (!document.hidden) {
      refresh();
    }
  });

  control.hidden = false;
  describe();
  schedule();
})();
