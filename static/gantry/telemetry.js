// Gantry: draws the telemetry charts with the vendored Plotly.js. The series come ready
// from the server in <script type="application/json"> blocks (Django's json_script): this
// file only hands them to Plotly, it computes nothing. Every chart has a table beside it.
"use strict";

(function () {
  // One colour per accounting category and step-time part, the same on every chart.
  var COLORS = {
    effective: "#2e9d5b",
    lost: "#c2332b",
    startup: "#b7791f",
    checkpoint: "#805ad5",
    interactive_idle: "#b83280",
    idle: "#8792a2",
    input_wait: "#dd6b20",
    comm_wait: "#3182ce",
    compute: "#2e9d5b",
    data_wait: "#dd6b20",
    markers: "#805ad5",
  };

  var shared = window.GantryCharts; // from gantry.js, loaded first
  var CONFIG = shared.config;
  var settle = shared.settle;
  var plot = shared.plot;

  function payload(element) {
    var source = document.getElementById(element.getAttribute("data-chart-source"));
    return source ? JSON.parse(source.textContent) : null;
  }

  function layout(element, chart) {
    return shared.layout(element, {
      showlegend: true, // also for one series: the legend names what the colour means
      hovermode: "closest",
      xaxis: shared.axis(chart.x_title),
      yaxis: shared.axis(chart.y_title),
    });
  }

  function barChart(element, chart) {
    var horizontal = chart.orientation === "h";
    var value = horizontal ? "%{x}" : "%{y}";
    var traces = chart.traces.map(function (trace) {
      return {
        type: "bar",
        orientation: horizontal ? "h" : "v",
        name: trace.name,
        x: horizontal ? trace.values : chart.categories,
        y: horizontal ? chart.categories : trace.values,
        marker: { color: COLORS[trace.key] },
        hovertemplate: value + " " + chart.unit + "<extra>%{fullData.name}</extra>",
      };
    });
    var shape = layout(element, chart);
    shape.barmode = "stack";
    if (horizontal) {
      shape.yaxis.type = "category";
      shape.yaxis.autorange = "reversed"; // the first attempt on top, the run last
    }
    plot(element, traces, shape);
  }

  function activityChart(element, chart) {
    var select = document.getElementById(element.getAttribute("data-metric-select"));

    function traces(metric) {
      var lines = chart.lines.map(function (line) {
        return {
          type: "scatter",
          mode: "lines",
          name: line.name,
          x: line.x,
          y: line[metric],
          hovertemplate: "%{y} %<extra>%{fullData.name}</extra>",
        };
      });
      if (chart.markers.x.length) {
        lines.push({
          type: "scatter",
          mode: "markers",
          name: chart.markers.name,
          x: chart.markers.x,
          y: chart.markers.y,
          text: chart.markers.text,
          marker: { symbol: "triangle-down", size: 11, color: COLORS.markers },
          hovertemplate: "%{text}<extra></extra>",
        });
      }
      return lines;
    }

    var shape = layout(element, chart);
    shape.yaxis.range = [0, 105];
    plot(element, traces(select ? select.value : "activity"), shape);
    if (select) {
      var controls = select.closest("[hidden]"); // shown only where the chart is drawn
      if (controls) {
        controls.hidden = false;
      }
      select.addEventListener("change", function () {
        window.Plotly.react(element, traces(select.value), shape, CONFIG);
      });
    }
  }

  var DRAW = { bar: barChart, activity: activityChart };

  document.addEventListener("DOMContentLoaded", function () {
    var charts = document.querySelectorAll("[data-chart-source]");
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
