// Gantry: small progressive enhancements. Every page works without this file.
"use strict";

(function () {
  // Replace a container's content with a server-rendered fragment, periodically, until the
  // fragment marks itself terminal with [data-terminal].
  function poll(container) {
    var url = container.getAttribute("data-poll-url");
    var interval = parseInt(container.getAttribute("data-poll-interval"), 10) || 2000;
    var failures = 0;
    var timer = null;
    var shown = null; // the last fragment put in the page, without its per-request CSRF token

    function withoutToken(html) {
      return html.replace(/name="csrfmiddlewaretoken" value="[^"]*"/g, "");
    }

    function schedule(delay) {
      timer = window.setTimeout(tick, delay);
    }

    function tick() {
      timer = null;
      if (document.hidden) {
        return; // resumed by the visibilitychange listener
      }
      fetch(url, {
        credentials: "same-origin",
        headers: { "X-Requested-With": "XMLHttpRequest" },
        cache: "no-store",
      })
        .then(function (response) {
          if (response.redirected) {
            window.location.reload(); // the session ended: go through the login page
            return null;
          }
          if (!response.ok) {
            throw new Error("HTTP " + response.status);
          }
          return response.text();
        })
        .then(function (html) {
          if (html === null) {
            return;
          }
          failures = 0;
          // Replace only on change, so focus (e.g. on the cancel button) survives a poll.
          if (withoutToken(html) !== shown) {
            shown = withoutToken(html);
            container.innerHTML = html;
          }
          if (!container.querySelector("[data-terminal]")) {
            schedule(interval);
          }
        })
        .catch(function () {
          failures += 1;
          if (failures < 10) {
            schedule(interval * Math.min(2 ** failures, 15));
          }
        });
    }

    document.addEventListener("visibilitychange", function () {
      if (!document.hidden && timer === null && !container.querySelector("[data-terminal]")) {
        tick();
      }
    });
    if (!container.querySelector("[data-terminal]")) {
      schedule(interval);
    }
  }

  // Show only the projects of the chosen tenant (options are grouped by tenant slug).
  function filterProjects(select) {
    var source = document.getElementById(select.getAttribute("data-filter-by"));
    if (!source) {
      return;
    }
    function apply() {
      var groups = select.querySelectorAll("optgroup");
      groups.forEach(function (group) {
        var match = !source.value || group.label === source.value;
        group.hidden = !match;
        group.disabled = !match;
      });
      var chosen = select.selectedOptions[0];
      if (chosen && chosen.parentElement.disabled) {
        select.value = "";
      }
    }
    source.addEventListener("change", apply);
    apply();
  }

  // The submit form's quota check: re-rendered by the server whenever a field that decides
  // admission changes (debounced; a late answer to an older request is dropped).
  var PREVIEW_FIELDS = ["tenant", "flavor", "nodes", "gpus_per_node", "priority"];

  function preview(container) {
    var form = container.closest("form");
    if (!form) {
      return;
    }
    var url = container.getAttribute("data-preview-url");
    var timer = null;
    var latest = 0;

    function refresh() {
      var params = new URLSearchParams();
      PREVIEW_FIELDS.forEach(function (name) {
        var field = form.elements.namedItem(name);
        if (field && "value" in field) {
          params.set(name, field.value);
        }
      });
      var request = ++latest;
      fetch(url + "?" + params.toString(), {
        credentials: "same-origin",
        headers: { "X-Requested-With": "XMLHttpRequest" },
        cache: "no-store",
      })
        .then(function (response) {
          // 400 carries a fragment too: it says what is missing.
          if (response.redirected || (!response.ok && response.status !== 400)) {
            return null;
          }
          return response.text();
        })
        .then(function (html) {
          if (html !== null && request === latest) {
            container.innerHTML = html;
          }
        })
        .catch(function () {
          // Keep the last answer; the next change tries again.
        });
    }

    function changed(event) {
      if (PREVIEW_FIELDS.indexOf(event.target.name) === -1) {
        return;
      }
      window.clearTimeout(timer);
      timer = window.setTimeout(refresh, 300);
    }
    form.addEventListener("input", changed);
    form.addEventListener("change", changed);
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-poll-url]").forEach(poll);
    document.querySelectorAll("[data-preview-url]").forEach(preview);
    document.querySelectorAll("select[data-filter-by]").forEach(filterProjects);

    document.querySelectorAll("select[data-autosubmit]").forEach(function (select) {
      select.addEventListener("change", function () {
        select.form.requestSubmit();
      });
    });

    // Confirmation for destructive forms; delegated so it also covers polled fragments.
    document.addEventListener("submit", function (event) {
      var form = event.target;
      var question = form.getAttribute && form.getAttribute("data-confirm");
      if (question && !window.confirm(question)) {
        event.preventDefault();
      }
    });
  });
})();
