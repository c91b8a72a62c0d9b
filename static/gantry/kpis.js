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

  function layout(element, chart) {
    var horizontal = chart.orientation === "h";
    function categoryAxis(title) {
      return { title: { text: title || "" }, type: "category", automargin: true };
    }
    // A share has a fixed scale (value_range, e.g. 0 to 100 %): autoscaled, one bar of 1 %
    // would be drawn as wide as a full one.
    function valueAxis(title) {
      var extra = chart.value_range
        ? { range: chart.value_range, autorange: false, fixedrange: true }
        : { rangemode: "tozero" };
      return shared.axis(title, extra);
    }
    var shape = shared.layout(element, {
      hovermode: "closest",
      barmode: "group",
      showlegend: chart.traces.length > 1,
      xaxis: horizontal ? valueAxis(chart.x_title) : categoryAxis(chart.x_title),
      yaxis: horizontal ? categoryAxis(chart.y_title) : valueAxis(chart.y_title),
    });
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

  function drawAll(root) {
    var charts = root.querySelectorAll("[data-kpi-chart]");
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
  }

  document.addEventListener("DOMContentLoaded", function () {
    drawAll(document);
    // The KPIs refresh themselves (a live page part): what is swapped in is drawn too.
    document.body.addEventListener("htmx:load", function (event) {
      if (event.detail.elt && event.detail.elt.querySelectorAll) {
        drawAll(event.detail.elt);
      }
    });
  });
})();
