// Gantry: draws the finance charts (monthly trend, budget burn-down) with the vendored
// Plotly.js. The series come ready from the server in <script type="application/json">
// blocks (Django's json_script): this file only hands them to Plotly, it computes nothing.
// Every chart has a table beside it with the same numbers.
"use strict";

(function () {
  var COLORS = { effective: "#2e9d5b", waste: "#c2332b" };
  // One colour per flavor on the burn-down: its usage and its budget share it.
  var PALETTE = ["#2f5bd3", "#dd6b20", "#805ad5", "#2e9d5b", "#b7791f", "#c2332b", "#3182ce"];

  var shared = window.GantryCharts; // from gantry.js, loaded first
  var settle = shared.settle;
  var plot = shared.plot;

  function payload(element) {
    var source = document.getElementById(element.getAttribute("data-finance-chart"));
    return source ? JSON.parse(source.textContent) : null;
  }

  function layout(element, chart) {
    return shared.layout(element, {
      showlegend: true, // also for one series: the legend names what the colour means
      hovermode: "x unified",
      xaxis: shared.axis(chart.x_title),
      yaxis: shared.axis(chart.y_title, { rangemode: "tozero" }),
    });
  }

  function barChart(element, chart) {
    var traces = chart.traces.map(function (trace) {
      return {
        type: "bar",
        name: trace.name,
        x: chart.categories,
        y: trace.values,
        marker: { color: COLORS[trace.key] },
        hovertemplate: "%{y} " + chart.unit + "<extra>%{fullData.name}</extra>",
      };
    });
    var shape = layout(element, chart);
    shape.barmode = "stack";
    shape.xaxis.type = "category";
    plot(element, traces, shape);
  }

  function lineChart(element, chart) {
    var traces = chart.lines.map(function (line) {
      return {
        type: "scatter",
        mode: "lines",
        name: line.name,
        x: chart.x,
        y: line.y,
        line: { color: PALETTE[line.group % PALETTE.length], dash: line.dash ? "dash" : "solid" },
        hovertemplate: "%{y} " + chart.unit + "<extra>%{fullData.name}</extra>",
      };
    });
    var shape = layout(element, chart);
    if (chart.y_range) {
      // The server ends the axis above the use when the budgets would flatten it.
      shape.yaxis.range = chart.y_range;
      shape.yaxis.autorange = false;
    }
    plot(element, traces, shape);
  }

  var DRAW = { bar: barChart, lines: lineChart };

  document.addEventListener("DOMContentLoaded", function () {
    var charts = document.querySelectorAll("[data-finance-chart]");
    if (!window.Plotly) {
      charts.forEach(function (element) {
        settle(element, "The chart could not be drawn; the table holds the same numbers.");
      });
      return;
    }
    charts.forEach(function (element) {
      var chart = payload(element);
      if (chart && DRAW[chart.kind]) {
        DRAW[chart.kind](element, chart);
      }
    });
  });
})();
