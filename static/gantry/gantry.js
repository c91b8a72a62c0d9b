// Gantry: small progressive enhancements. Every page works without this file.
"use strict";

// What the chart scripts (telemetry.js, finance.js, kpis.js) share; they load after this file.
window.GantryCharts = (function () {
  var config = {
    displaylogo: false,
    responsive: true,
    modeBarButtonsToRemove: ["lasso2d", "select2d"],
  };

  // Charts are rendered busy, with a "Loading chart…" placeholder, while Plotly loads.
  function settle(element, message) {
    var status = element.querySelector(".chart-status");
    if (message && status) {
      status.textContent = message;
    } else if (status) {
      status.remove();
    }
    element.setAttribute("aria-busy", "false");
  }

  function plot(element, traces, shape) {
    settle(element);
    return window.Plotly.newPlot(element, traces, shape, config);
  }

  var GRID = "rgba(128,128,128,0.2)";

  // The layout every chart starts from: transparent, in the page's font and text colour
  // (light and dark schemes alike), the legend above the plot in the order of the traces
  // (Plotly reverses stacked bars otherwise). ``extra`` adds to it or overrides it.
  function layout(element, extra) {
    var style = window.getComputedStyle(element);
    var shape = {
      paper_bgcolor: "rgba(0,0,0,0)",
      plot_bgcolor: "rgba(0,0,0,0)",
      font: { family: style.fontFamily, color: style.color, size: 12 },
      margin: { l: 10, r: 10, t: 10, b: 10 },
      legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom", traceorder: "normal" },
    };
    return Object.assign(shape, extra || {});
  }

  // An axis with a grid and a title (none when ``title`` is empty).
  function axis(title, extra) {
    return Object.assign({ title: { text: title || "" }, automargin: true, gridcolor: GRID }, extra || {});
  }

  return { config: config, settle: settle, plot: plot, layout: layout, axis: axis };
})();

(function () {
  document.documentElement.classList.replace("no-js", "js");

  // Timestamps: the server writes <time datetime="ISO 8601 with offset">its text in UTC</time>.
  // Shown in the browser's time zone in the shape of the server's text (a date; a date and a
  // minute; a date and a second), the server's UTC text kept as the title. A relative text
  // ("3 hours ago") stays and gets the local time as its title.
  var TIME_SHAPES = [
    { pattern: /^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}/, minute: true, second: true },
    { pattern: /^\d{4}-\d{2}-\d{2} \d{2}:\d{2}/, minute: true, second: false },
    { pattern: /^\d{4}-\d{2}-\d{2}$/, minute: false, second: false },
  ];
  var LOCAL_TIME = new Intl.DateTimeFormat("en-GB", {
    year: "numeric",
    month: "2-digit",
    day: "2-digit",
    hour: "2-digit",
    minute: "2-digit",
    second: "2-digit",
    hourCycle: "h23",
    timeZoneName: "short",
  });

  function localText(moment, shape) {
    var p = {};
    LOCAL_TIME.formatToParts(moment).forEach(function (part) {
      p[part.type] = part.value;
    });
    var text = p.year + "-" + p.month + "-" + p.day;
    if (shape.minute) {
      text += " " + p.hour + ":" + p.minute + (shape.second ? ":" + p.second : "");
      text += " " + p.timeZoneName;
    }
    return text;
  }

  function localizeTimes(root) {
    root.querySelectorAll("time[datetime]:not([data-localized])").forEach(function (element) {
      var value = element.getAttribute("datetime");
      var moment = new Date(value);
      if (value.indexOf("T") === -1 || isNaN(moment.getTime())) {
        return; // a calendar date (a UTC day or month of finance) is the same everywhere
      }
      var original = element.textContent.trim();
      var shape = TIME_SHAPES.find(function (candidate) {
        return candidate.pattern.test(original);
      });
      if (shape) {
        element.textContent = localText(moment, shape);
        element.title = original;
      } else {
        element.title = localText(moment, TIME_SHAPES[0]);
      }
      element.setAttribute("data-localized", "");
    });
  }

  // Exports are fetched in the background, so the page can say that the file is being
  // prepared, then saved under the server's file name. An answer that is no file (a 400 with
  // the form's errors) is shown by loading the same URL as a page.
  function fileName(response) {
    var header = response.headers.get("Content-Disposition") || "";
    var match = /filename="?([^";]+)"?/.exec(header);
    return match ? match[1] : null;
  }

  function download(url, trigger, status) {
    if (trigger.getAttribute("aria-busy") === "true") {
      return;
    }
    function show(busy, message) {
      if (busy) {
        trigger.setAttribute("aria-busy", "true");
        trigger.setAttribute("aria-disabled", "true");
      } else {
        trigger.removeAttribute("aria-busy");
        trigger.removeAttribute("aria-disabled");
      }
      if (status) {
        status.textContent = message;
      }
    }
    show(true, "Preparing the file…");
    fetch(url, { credentials: "same-origin" })
      .then(function (response) {
        var name = fileName(response);
        if (!response.ok || !name) {
          window.location.assign(url);
          return null;
        }
        return response.blob().then(function (blob) {
          var link = document.createElement("a");
          link.href = URL.createObjectURL(blob);
          link.download = name;
          document.body.appendChild(link);
          link.click();
          link.remove();
          window.setTimeout(function () {
            URL.revokeObjectURL(link.href);
          }, 60000);
          show(false, "Downloaded " + name + ".");
        });
      })
      .catch(function () {
        show(false, "The download failed: check the connection and try again.");
      });
  }

  function downloadStatus(element) {
    var id = element.getAttribute("data-download-status");
    return id ? document.getElementById(id) : null;
  }

  // Live sections (jobs/live.py): htmx polls the page's [data-live-poll-ms] element and swaps
  // in the sections that changed, out of band. What the page does to its own content on
  // load is done to each swapped section too.
  function showLogsFromTheirEnd() {
    document.querySelectorAll("pre.logs:not([data-scrolled])").forEach(function (log) {
      log.scrollTop = log.scrollHeight;
      log.setAttribute("data-scrolled", "");
    });
  }

  function livePoller(event) {
    var element = event.detail && event.detail.elt;
    return (
      element &&
      element.hasAttribute &&
      (element.hasAttribute("data-live-poll-ms") || element.hasAttribute("data-live-list"))
    );
  }

  document.addEventListener("htmx:oobAfterSwap", function () {
    localizeTimes(document);
    showLogsFromTheirEnd();
  });
  // A page in a hidden tab skips its polls (the run page's and the run list's); the next one
  // after it is shown catches up.
  document.addEventListener("htmx:beforeRequest", function (event) {
    if (livePoller(event) && document.hidden) {
      event.preventDefault();
    }
  });
  // The session ended: the poll was answered by the login page. Load the page again, which
  // goes through the login form and back.
  document.addEventListener("htmx:afterRequest", function (event) {
    var xhr = event.detail.xhr;
    if (livePoller(event) && xhr && xhr.responseURL) {
      var asked = new URL(event.detail.requestConfig.path, window.location.href).pathname;
      if (new URL(xhr.responseURL).pathname !== asked) {
        window.location.reload();
      }
    }
  });

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

  // The submit form's quota check (templates/jobs/run_submit.html): htmx asks the server for
  // it again a moment after a field it sends (its hx-include) changes. Here: busy from that
  // change until the answer is in; a 400 is an answer too (it says what is missing); an
  // answer from another address (the login page: the session ended) is dropped, keeping the
  // last one, since reloading would lose what was typed; and once the form is sent, no check
  // goes out, nor stays on its way to race the submit.
  function quotaCheck(panel) {
    var form = panel.closest("form");
    var answer = panel.querySelector("[data-preview-url]");
    var fields = panel.getAttribute("hx-include");
    if (!form || !answer || !fields) {
      return;
    }
    function busy(value) {
      answer.setAttribute("aria-busy", value ? "true" : "false");
    }
    form.addEventListener("input", function (event) {
      if (event.target.matches && event.target.matches(fields)) {
        busy(true);
      }
    });
    form.addEventListener("submit", function () {
      window.htmx.trigger(panel, "htmx:abort");
    });
    panel.addEventListener("htmx:beforeRequest", function (event) {
      if (form.hasAttribute("data-submitting")) {
        event.preventDefault();
      } else {
        busy(true);
      }
    });
    panel.addEventListener("htmx:beforeSwap", function (event) {
      var xhr = event.detail.xhr;
      var asked = new URL(event.detail.pathInfo.requestPath, window.location.href).pathname;
      if (xhr.responseURL && new URL(xhr.responseURL).pathname !== asked) {
        event.detail.shouldSwap = false;
        event.stopPropagation(); // not the page's reload of a poll sent to the login page
      } else if (xhr.status === 400) {
        event.detail.shouldSwap = true;
        event.detail.isError = false;
      }
    });
    panel.addEventListener("htmx:afterRequest", function () {
      busy(false);
    });
  }

  // A form's one-time submission key is kept in its history entry when it is sent. Going
  // back to that entry may fetch the page anew, with a new key, while the browser restores
  // the typed values: putting the sent key back makes a second submit of the same form
  // land on the run it already queued instead of queueing another.
  function rememberSubmissionKey(form) {
    var key = form.elements.namedItem("submission_key");
    if (form.hasAttribute("data-submit-once") && key && key.value) {
      var state = Object.assign({}, window.history.state, { submissionKey: key.value });
      window.history.replaceState(state, "");
    }
  }

  function restoreSubmissionKey() {
    var sent = window.history.state && window.history.state.submissionKey;
    if (sent) {
      document.querySelectorAll("form[data-submit-once]").forEach(function (form) {
        var key = form.elements.namedItem("submission_key");
        if (key) {
          key.value = sent;
        }
      });
    }
  }

  // A copy button ([data-copy] naming a field's id) copies the field's value to the
  // clipboard; hidden without this script, where the field is there to select and copy.
  // Where the clipboard is refused, the value is selected for the reader to copy.
  function copyButton(button) {
    var field = document.getElementById(button.getAttribute("data-copy"));
    var status = button.parentElement.querySelector("[data-copy-status]");
    if (!field) {
      return;
    }
    function say(message) {
      if (status) {
        status.textContent = message;
      }
    }
    function selectInstead() {
      field.focus();
      field.select();
      say("Selected: press Ctrl+C (⌘C) to copy.");
    }
    button.hidden = false;
    button.addEventListener("click", function () {
      if (!navigator.clipboard || !window.isSecureContext) {
        selectInstead();
        return;
      }
      navigator.clipboard.writeText(field.value).then(function () {
        say("Copied.");
      }, selectInstead);
    });
  }

  // Copy buttons (templates/images/_digest.html): the whole digest to the clipboard. Where the
  // clipboard is not available (a page served over plain HTTP from another host), the text is
  // selected for Ctrl+C instead. Delegated, so parts swapped in by htmx work too.
  function selectText(element) {
    var range = document.createRange();
    range.selectNodeContents(element);
    var selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
  }

  function copyText(button) {
    var box = button.closest(".copyable");
    var source = box && box.querySelector("[data-copy-source]");
    var status = box && box.querySelector(".copy-status");
    if (!source || !status) {
      return;
    }
    var text = source.textContent.trim();
    function say(message) {
      status.textContent = message;
      window.clearTimeout(button.copyTimer);
      button.copyTimer = window.setTimeout(function () {
        status.textContent = "";
      }, 4000);
    }
    function selectInstead() {
      selectText(source);
      say("Selected: press Ctrl+C to copy");
    }
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(function () {
        say("Copied");
      }, selectInstead);
    } else {
      selectInstead();
    }
  }

  document.addEventListener("DOMContentLoaded", function () {
    restoreSubmissionKey();
    // A log tail is read from its end: show its last lines first.
    showLogsFromTheirEnd();
    localizeTimes(document);
    // What htmx swaps in (a live list polling itself) shows its times like the page does.
    document.body.addEventListener("htmx:load", function (event) {
      localizeTimes(event.detail.elt);
    });
    // A poll answered from another address was sent to the login page (the session ended):
    // go through it with the whole page instead of drawing it inside the list.
    document.body.addEventListener("htmx:beforeSwap", function (event) {
      var xhr = event.detail.xhr;
      var asked = event.detail.pathInfo && event.detail.pathInfo.requestPath;
      if (xhr && xhr.responseURL && asked) {
        var answered = new URL(xhr.responseURL).pathname;
        if (answered !== new URL(asked, window.location.href).pathname) {
          event.detail.shouldSwap = false;
          window.location.reload();
        }
      }
    });
    document.querySelectorAll(".preview-panel[hx-get]").forEach(quotaCheck);
    document.querySelectorAll("select[data-filter-by]").forEach(filterProjects);
    document.querySelectorAll("button[data-copy]").forEach(copyButton);

    document.querySelectorAll("select[data-autosubmit]").forEach(function (select) {
      select.addEventListener("change", function () {
        select.form.requestSubmit();
      });
    });

    // Confirmation for destructive forms, then the busy state; delegated so it also covers
    // live sections swapped in. Every form sends one request: a second click while the first is on
    // its way is dropped, and its submit button shows that the answer is coming. (Forms
    // marked [data-submit-once] are also deduped by the server, with a one-time key per
    // form.) The button is not disabled: a disabled submitter would drop its name and value
    // from the request. Export forms ([data-download]) fetch their file instead.
    document.addEventListener("submit", function (event) {
      var form = event.target;
      var question = form.getAttribute && form.getAttribute("data-confirm");
      if (question && !window.confirm(question)) {
        event.preventDefault();
        return;
      }
      if (form.hasAttribute("data-download")) {
        event.preventDefault();
        var submitter = event.submitter || form.querySelector("button");
        var action = (event.submitter && event.submitter.getAttribute("formaction")) || form.action;
        var query = new URLSearchParams(new FormData(form)).toString();
        download(action + "?" + query, submitter, downloadStatus(form));
        return;
      }
      if (form.hasAttribute("data-submitting")) {
        event.preventDefault();
        return;
      }
      form.setAttribute("data-submitting", "");
      form.setAttribute("aria-busy", "true");
      rememberSubmissionKey(form);
      var button = event.submitter || form.querySelector("button[type=submit]");
      if (button) {
        button.setAttribute("aria-busy", "true");
        button.setAttribute("aria-disabled", "true");
      }
    });
    // A page restored by the back button can be submitted again (the server then answers
    // with the run the form already queued).
    window.addEventListener("pageshow", function () {
      document.querySelectorAll("form[data-submitting]").forEach(function (form) {
        form.removeAttribute("data-submitting");
        form.removeAttribute("aria-busy");
        form.querySelectorAll("[aria-busy]").forEach(function (button) {
          button.removeAttribute("aria-busy");
          button.removeAttribute("aria-disabled");
        });
      });
      restoreSubmissionKey();
    });

    document.addEventListener("click", function (event) {
      var copy = event.target.closest && event.target.closest("[data-copy]");
      if (copy) {
        copyText(copy);
        return;
      }
      var link = event.target.closest && event.target.closest("a[data-export]");
      if (link && event.button === 0 && !event.ctrlKey && !event.metaKey && !event.shiftKey) {
        event.preventDefault();
        download(link.href, link, downloadStatus(link));
      }
    });
  });
})();
