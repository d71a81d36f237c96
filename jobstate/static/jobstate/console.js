/* The jobstate console's small enhancements, on every jobstate admin page:
 *
 * - copy buttons (class jobstate-copy, value in data-copy) put their value on the
 *   clipboard and say so on the button for a moment; outside a secure context (plain
 *   HTTP on another host) the older selection-and-copy command is used;
 * - instants (<time class="jobstate-moment" datetime=ISO>) are shown in the viewer's
 *   time zone, "2026-12-02 15:30:12 CET", the server's text kept in the tooltip;
 * - a list's filter sidebar can be hidden, and stays as the operator left it;
 * - on a phone, the columns a list leaves out can be shown ("All columns"), and stay
 *   shown until the operator asks for fewer.
 *
 * Progressive enhancement: without the script the server's text stays (the server's
 * zone, named), ids are whole in their tooltip and the sidebar is shown. Parts of a
 * page that live.js replaces are enhanced again when they arrive. No dependencies.
 */
(function () {
  "use strict";

  var FILTERS_KEY = "jobstate.console.filters-hidden";
  var COLUMNS_KEY = "jobstate.console.all-columns";

  // --- copy buttons ---------------------------------------------------------------

  function copyWithSelection(text) {
    var area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.style.position = "fixed";
    area.style.top = "-1000px";
    document.body.appendChild(area);
    area.select();
    var copied = false;
    try {
      copied = document.execCommand("copy");
    } catch (error) {
      copied = false;
    }
    document.body.removeChild(area);
    return copied ? Promise.resolve() : Promise.reject(new Error("copy refused"));
  }

  function copy(text) {
    if (navigator.clipboard && window.isSecureContext) {
      return navigator.clipboard.writeText(text).catch(function () {
        return copyWithSelection(text);
      });
    }
    return copyWithSelection(text);
  }

  function flash(button, className, label) {
    if (!button.hasAttribute("data-label")) {
      button.setAttribute("data-label", button.textContent);
    }
    button.classList.remove("jobstate-copied", "jobstate-copy-failed");
    button.classList.add(className);
    button.textContent = label;
    window.clearTimeout(button._jobstateTimer);
    button._jobstateTimer = window.setTimeout(function () {
      button.classList.remove(className);
      button.textContent = button.getAttribute("data-label");
    }, 1500);
  }

  document.addEventListener("click", function (event) {
    var button = event.target.closest ? event.target.closest("button.jobstate-copy") : null;
    if (!button) {
      return;
    }
    event.preventDefault();
    copy(button.getAttribute("data-copy") || "").then(
      function () {
        flash(button, "jobstate-copied", "✓ copied");
      },
      function () {
        flash(button, "jobstate-copy-failed", "✗");
      }
    );
  });

  // --- instants in the viewer's zone -----------------------------------------------

  function two(n) {
    return (n < 10 ? "0" : "") + n;
  }

  function zoneName(date) {
    try {
      var parts = new Intl.DateTimeFormat(undefined, { timeZoneName: "short" }).formatToParts(date);
      for (var i = 0; i < parts.length; i++) {
        if (parts[i].type === "timeZoneName") {
          return parts[i].value;
        }
      }
    } catch (error) {
      // An old browser without formatToParts: the offset below names the zone.
    }
    var offset = -date.getTimezoneOffset();
    var sign = offset < 0 ? "-" : "+";
    offset = Math.abs(offset);
    return "UTC" + sign + two(Math.floor(offset / 60)) + ":" + two(offset % 60);
  }

  function localText(date) {
    return (
      date.getFullYear() + "-" + two(date.getMonth() + 1) + "-" + two(date.getDate()) + " " +
      two(date.getHours()) + ":" + two(date.getMinutes()) + ":" + two(date.getSeconds()) + " " +
      zoneName(date)
    );
  }

  function showMoments(root) {
    var moments = root.querySelectorAll
      ? root.querySelectorAll("time.jobstate-moment[datetime]:not([data-jobstate-local])")
      : [];
    Array.prototype.forEach.call(moments, function (element) {
      var date = new Date(element.getAttribute("datetime"));
      if (isNaN(date.getTime())) {
        return;
      }
      var server = element.textContent;
      var shown = localText(date);
      element.setAttribute("data-jobstate-local", "");
      if (shown !== server) {
        var ago = element.getAttribute("title");
        element.setAttribute("title", (ago ? ago + " · " : "") + server);
        element.textContent = shown;
      }
    });
  }

  // --- the filter sidebar -----------------------------------------------------------

  function remembered(key) {
    try {
      return window.localStorage.getItem(key) === "1";
    } catch (error) {
      return false; // storage disabled: the page starts as the server sent it
    }
  }

  function remember(key, on) {
    try {
      window.localStorage.setItem(key, on ? "1" : "0");
    } catch (error) {
      // storage disabled: the choice lasts for this page only
    }
  }

  // A button that switches a class of the list on and off, remembered under ``key``:
  // ``onLabel`` and ``offLabel`` name the data attributes of its two labels (translated
  // by the server), the label shown being what a click will do; ``state`` is the ARIA
  // attribute that says whether it is on (``inverted`` when "on" means collapsed).
  function listToggle(options) {
    // A list, or a page of the console's own with a table (data-jobstate-columns).
    var changelist =
      document.getElementById("changelist") || document.querySelector("[data-jobstate-columns]");
    var button = document.getElementById(options.button);
    if (!changelist || !button) {
      return;
    }
    function show(on) {
      changelist.classList.toggle(options.className, on);
      button.textContent = button.getAttribute(on ? options.onLabel : options.offLabel);
      button.setAttribute(options.state, on !== Boolean(options.inverted) ? "true" : "false");
    }
    button.addEventListener("click", function () {
      var on = !changelist.classList.contains(options.className);
      remember(options.key, on);
      show(on);
    });
    show(remembered(options.key));
    button.hidden = false;
  }

  function filterToggle() {
    // The button is on the page (hidden) when the list has filters.
    if (!document.getElementById("changelist-filter")) {
      return;
    }
    listToggle({
      button: "jobstate-filter-toggle",
      className: "jobstate-filters-hidden",
      key: FILTERS_KEY,
      onLabel: "data-label-show",
      offLabel: "data-label-hide",
      state: "aria-expanded",
      inverted: true,
    });
  }

  // --- the columns a phone leaves out -----------------------------------------------

  function columnsToggle() {
    // The button is on the page (hidden) when the list leaves columns out on a phone;
    // the stylesheet shows it on phones only.
    listToggle({
      button: "jobstate-columns-toggle",
      className: "jobstate-all-columns",
      key: COLUMNS_KEY,
      onLabel: "data-label-fewer",
      offLabel: "data-label-all",
      state: "aria-pressed",
    });
  }

  function start() {
    showMoments(document);
    filterToggle();
    columnsToggle();
    if (window.MutationObserver) {
      // live.js swaps whole regions of the page: their instants are shown again.
      new MutationObserver(function (records) {
        records.forEach(function (record) {
          Array.prototype.forEach.call(record.addedNodes, function (node) {
            if (node.nodeType === 1) {
              if (node.matches && node.matches("time.jobstate-moment")) {
                showMoments(node.parentNode);
              } else {
                showMoments(node);
              }
            }
          });
        });
      }).observe(document.body, { childList: true, subtree: true });
    }
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
