// Gantry: draws the platform KPI charts with the vendored Plotly.js. The series come ready
// from the server in <script type="application/json"> blocks (Django's json_script): this
// file only hands them to Plotly, it computes nothing. Every chart has a table beside it.
"use strict";

(function () {
  var COLORS = ["#3182ce", "#dd6b20", "#2e9d5b", "#805ad5"];

  var shared = window.GantryCharts; // from gantry.js, loaded first
  var settle = shared.settle;
  var plot = shared.plot;

  function payload(element) {
    var source = document.getElementById(element.getAttribute("data-kpi-chart"));
    return source ? JSON.parse(source.textContent) : null;
  }

  // Transparent, in the page's font and text colour (light and dark schemes alike).
  function layout(element, chart) {
    var style = window.getComputedStyle(element);
    var horizontal = chart.orientation === "h";
    var categoryAxis = { type: "category", automargin: true };
    var valueAxis = { automargin: true, gridcolor: "rgba(128,128,128,0.2)", rangemode: "tozero" };
    var shape = {
      paper_bgcolor: "rgba(0,0,0,0)",
      plot_bgcolor: "rgba(0,0,0,0)",
      font: { family: style.fontFamily, color: style.color, size: 12 },
      margin: { l: 10, r: 10, t: 10, b: 10 },
      legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom", traceorder: "normal" },
      hovermode: "closest",
      barmode: "group",
      showlegend: chart.traces.length > 1,
      xaxis: horizontal ? valueAxis : categoryAxis,
      yaxis: horizontal ? categoryAxis : valueAxis,
    };
    shape.xaxis.title = { text: chart.x_title || "" };
    shape.yaxis.title = { text: chart.y_title || "" };
    if (horizontal) {
      shape.yaxis.autorange = "reversed"; // in the table's order, top to bottom
    }
    return shape;
  }

  // Grouped bars: one trace per {name, values}, values aligned with the categories.
  function draw(element, chart) {
    var horizontal = chart.orientation === "h";
    var value = horizontal ? "%{x}" : "%{y}";
    var traces = chart.traces.map(function (trace, index) {
      return {
        type: "bar",
        orientation: horizontal ? "h" : "v",
        name: trace.name,
        x: horizontal ? trace.values : chart.categories,
        y: horizontal ? chart.categories : trace.values,
        marker: { color: COLORS[index % COLORS.length] },
        hovertemplate: value + " " + chart.unit + "<extra>%{fullData.name}</extra>",
      };
    });
    plot(element, traces, layout(element, chart));
  }

  document.addEventListener("DOMContentLoaded", function () {
    var charts = document.querySelectorAll("[data-kpi-chart]");
    if (!window.Plotly) {
      charts.forEach(function (element) {
        settle(element, "The chart could not be drawn; the table holds the same numbers.");
      });
      return;
    }
    charts.forEach(function (element) {
      var chart = payload(element);
      if (chart) {
        draw(element, chart);
      }
    });
  });
})();
