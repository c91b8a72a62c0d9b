// Gantry: structured editors for the JSON fields of the submit and template forms.
//
// Progressive enhancement: the JSON textarea (marked [data-editor]) stays the field the form
// sends. With this file, rows of labelled inputs are shown above it and the textarea moves
// into an "Advanced: JSON" disclosure; every change of the rows rewrites the JSON, and JSON
// typed there rebuilds the rows when it parses. JSON the rows cannot show without changing it
// (an env value that is no string, a field a template does not set) is edited as JSON only,
// and the editor says why. The hints here are for convenience: the server checks everything
// again and its errors are shown next to the field.
"use strict";

(function () {
  var JSON_NUMBER = /^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?$/;
  var INTEGER = /^-?(0|[1-9][0-9]*)$/;
  var LINE_BREAK = /[\r\n]/;
  var counter = 0;

  function nextId(prefix) {
    counter += 1;
    return "kv-" + prefix + "-" + counter;
  }

  function element(tag, attributes, children) {
    var node = document.createElement(tag);
    Object.keys(attributes || {}).forEach(function (name) {
      var value = attributes[name];
      if (value === null || value === undefined || value === false) {
        return;
      }
      if (name === "text") {
        node.textContent = value;
      } else {
        node.setAttribute(name, value === true ? "" : String(value));
      }
    });
    (children || []).forEach(function (child) {
      if (child) {
        node.appendChild(child);
      }
    });
    return node;
  }

  function has(object, key) {
    return Object.prototype.hasOwnProperty.call(object, key);
  }

  function isObject(value) {
    return value !== null && typeof value === "object" && !Array.isArray(value);
  }

  // JSON.parse, remembering each number's text as written (where the browser tells it), so
  // 1.0 stays a float and a long integer keeps its digits when the rows write it back.
  function parseJson(text) {
    var sources = new Map();
    var value = JSON.parse(text, function (key, item, context) {
      if (typeof item === "number") {
        if (!sources.has(this)) {
          sources.set(this, {});
        }
        var source = context && typeof context.source === "string" ? context.source : null;
        sources.get(this)[key] = source || String(item);
      }
      return item;
    });
    return {
      value: value,
      numberText: function (holder, key) {
        var known = sources.get(holder);
        return known && has(known, key) ? known[key] : String(holder[key]);
      },
    };
  }

  // An object's JSON from [key, JSON text] pairs, indented as the server writes it.
  function objectText(entries, depth) {
    if (!entries.length) {
      return "{}";
    }
    var pad = "  ".repeat(depth + 1);
    var lines = entries.map(function (entry) {
      return pad + JSON.stringify(entry[0]) + ": " + entry[1];
    });
    return "{\n" + lines.join(",\n") + "\n" + "  ".repeat(depth) + "}";
  }

  function option(value, text, selected) {
    return element("option", { value: value, text: text, selected: selected });
  }

  function select(attributes, choices, chosen) {
    return element(
      "select",
      attributes,
      choices.map(function (choice) {
        return option(choice[0], choice[1], choice[0] === chosen);
      })
    );
  }

  function textInput(attributes, value) {
    var input = element(
      "input",
      Object.assign({ type: "text", spellcheck: "false", autocomplete: "off" }, attributes)
    );
    input.value = value || "";
    return input;
  }

  function textArea(attributes, value) {
    var area = element("textarea", Object.assign({ rows: 2, spellcheck: "false" }, attributes));
    area.value = value || "";
    return area;
  }

  function capitalized(text) {
    return text.charAt(0).toUpperCase() + text.slice(1);
  }

  // Keys given in more than one row, each once, in the order they first repeat.
  function repeatedKeys(keys) {
    var seen = {};
    var repeated = [];
    keys.forEach(function (key) {
      if (key !== "" && has(seen, key) && repeated.indexOf(key) === -1) {
        repeated.push(key);
      }
      seen[key] = true;
    });
    return repeated;
  }

  // --- the kinds of rows ---------------------------------------------------------------------

  // A kind describes one field's rows: its columns (controls made from a row's data, read
  // back by ``data-column``), how JSON becomes rows (``fromJson``: rows, or a reason they
  // cannot show it) and rows become JSON (``toJson``: the text, the problems that keep it from
  // being written, and hints).

  var PARAM_TYPES = [
    ["string", "string"],
    ["number", "number"],
    ["boolean", "boolean"],
    ["json", "JSON"],
  ];

  function paramValueControl(row, label) {
    if (row.type === "boolean") {
      return select(
        { "aria-label": label },
        [["true", "true"], ["false", "false"]],
        row.value === "false" ? "false" : "true"
      );
    }
    return textInput(
      { "aria-label": label, inputmode: row.type === "number" ? "decimal" : null },
      row.value
    );
  }

  var paramsKind = {
    noun: "parameter",
    add: "Add parameter",
    empty: "No parameters.",
    columns: [
      { name: "key", label: "Name" },
      { name: "type", label: "Type" },
      { name: "value", label: "Value" },
    ],
    blank: function () {
      return { key: "", type: "string", value: "" };
    },
    control: function (column, row, label) {
      if (column === "key") {
        return textInput({ "aria-label": label }, row.key);
      }
      if (column === "type") {
        return select({ "aria-label": label }, PARAM_TYPES, row.type);
      }
      return paramValueControl(row, label);
    },
    // A changed type changes the value's control (a select for booleans).
    dependsOn: { type: "value" },
    fromJson: function (parsed) {
      var value = parsed.value;
      if (!isObject(value)) {
        return { reason: "The parameters must be a JSON object." };
      }
      return {
        rows: Object.keys(value).map(function (key) {
          var item = value[key];
          if (typeof item === "string" && !LINE_BREAK.test(item)) {
            return { key: key, type: "string", value: item };
          }
          if (typeof item === "number") {
            return { key: key, type: "number", value: parsed.numberText(value, key) };
          }
          if (typeof item === "boolean") {
            return { key: key, type: "boolean", value: String(item) };
          }
          return { key: key, type: "json", value: JSON.stringify(item) };
        }),
      };
    },
    isBlank: function (row) {
      return row.key === "" && (row.type === "boolean" || row.value.trim() === "");
    },
    toJson: function (rows) {
      var entries = [];
      var problems = [];
      rows.forEach(function (row) {
        var name = row.data.key;
        if (name === "") {
          problems.push({ control: row.controls.key, message: "Name parameter " + row.number + "." });
          return;
        }
        var value = row.data.value.trim();
        if (row.data.type === "string") {
          entries.push([name, JSON.stringify(row.data.value)]);
        } else if (row.data.type === "boolean") {
          entries.push([name, value === "false" ? "false" : "true"]);
        } else if (row.data.type === "number") {
          if (!JSON_NUMBER.test(value)) {
            problems.push({
              control: row.controls.value,
              message: name + ": " + JSON.stringify(row.data.value) + " is not a number.",
            });
          } else {
            entries.push([name, value]);
          }
        } else {
          try {
            JSON.parse(value);
            entries.push([name, value]);
          } catch (error) {
            problems.push({ control: row.controls.value, message: name + ": the value is not JSON." });
          }
        }
      });
      return {
        text: objectText(entries, 0),
        problems: problems,
        hints: repeatedHints(rows, "key", "the server accepts each name once."),
      };
    },
  };

  function repeatedHints(rows, column, consequence) {
    return repeatedKeys(
      rows.map(function (row) {
        return row.data[column];
      })
    ).map(function (key) {
      return {
        control: rows.filter(function (row) {
          return row.data[column] === key;
        })[1].controls[column],
        message: key + " is given twice: " + consequence,
      };
    });
  }

  function envKind(namePattern) {
    return {
      noun: "variable",
      add: "Add variable",
      empty: "No variables.",
      columns: [
        { name: "key", label: "Name" },
        { name: "value", label: "Value" },
      ],
      blank: function () {
        return { key: "", value: "" };
      },
      control: function (column, row, label) {
        return textInput({ "aria-label": label }, row[column]);
      },
      dependsOn: {},
      fromJson: function (parsed) {
        var value = parsed.value;
        if (!isObject(value)) {
          return { reason: "The environment must be a JSON object of names to strings." };
        }
        var rows = [];
        var keys = Object.keys(value);
        for (var i = 0; i < keys.length; i += 1) {
          var item = value[keys[i]];
          if (typeof item !== "string") {
            return { reason: "The value of " + keys[i] + " is not a string." };
          }
          if (LINE_BREAK.test(item)) {
            return { reason: "The value of " + keys[i] + " has a line break." };
          }
          rows.push({ key: keys[i], value: item });
        }
        return { rows: rows };
      },
      isBlank: function (row) {
        return row.key === "" && row.value === "";
      },
      toJson: function (rows) {
        var entries = [];
        var problems = [];
        var hints = [];
        rows.forEach(function (row) {
          if (row.data.key === "") {
            problems.push({ control: row.controls.key, message: "Name variable " + row.number + "." });
            return;
          }
          if (namePattern && !namePattern.test(row.data.key)) {
            hints.push({
              control: row.controls.key,
              message:
                row.data.key +
                " is not a valid variable name: letters, digits and _, not starting with a digit, at most 128 characters.",
            });
          }
          entries.push([row.data.key, JSON.stringify(row.data.value)]);
        });
        return {
          text: objectText(entries, 0),
          problems: problems,
          hints: hints.concat(repeatedHints(rows, "key", "the server accepts each name once.")),
        };
      },
    };
  }

  // The defaults of a template: a partial spec, its groups (resources, code, dataset) nested.
  function templateValuesKind(fields) {
    var byName = {};
    fields.forEach(function (field) {
      byName[field.name] = field;
    });
    var groups = {};
    fields.forEach(function (field) {
      if (field.name.indexOf(".") !== -1) {
        groups[field.name.split(".")[0]] = true;
      }
    });
    var fieldChoices = [["", "Choose a field"]].concat(
      fields.map(function (field) {
        return [field.name, field.name];
      })
    );

    function valueControl(row, label) {
      var field = byName[row.field];
      if (field && field.choices) {
        return select(
          { "aria-label": label },
          [["", "Choose"]].concat(
            field.choices.map(function (choice) {
              return [choice, choice];
            })
          ),
          row.value
        );
      }
      if (field && (field.multiline || field.type === "object")) {
        return textArea({ "aria-label": label, class: field.type === "object" ? "mono" : null }, row.value);
      }
      return textInput(
        { "aria-label": label, inputmode: field && field.type === "integer" ? "numeric" : null },
        row.value
      );
    }

    // A row for one default, or a reason the rows cannot show it as it is.
    function rowOf(name, holder, key, parsed) {
      var field = byName[name];
      var item = holder[key];
      if (!field) {
        return { reason: name + " is not a field a template sets." };
      }
      if (field.type === "integer") {
        var text = typeof item === "number" ? parsed.numberText(holder, key) : "";
        if (!INTEGER.test(text)) {
          return { reason: name + " is not a whole number." };
        }
        return { row: { field: name, value: text } };
      }
      if (field.type === "object") {
        if (!isObject(item)) {
          return { reason: name + " is not a JSON object." };
        }
        return { row: { field: name, value: JSON.stringify(item) } };
      }
      if (typeof item !== "string") {
        return { reason: name + " is not a string." };
      }
      if (field.choices && field.choices.indexOf(item) === -1) {
        return { reason: name + " is one of " + field.choices.join(", ") + "." };
      }
      if (!field.multiline && LINE_BREAK.test(item)) {
        return { reason: name + " has a line break." };
      }
      return { row: { field: name, value: item } };
    }

    return {
      noun: "default",
      add: "Add default",
      empty: "No defaults.",
      columns: [
        { name: "field", label: "Field" },
        { name: "value", label: "Value" },
      ],
      blank: function () {
        return { field: "", value: "" };
      },
      control: function (column, row, label) {
        if (column === "field") {
          return select({ "aria-label": label }, fieldChoices, row.field);
        }
        return valueControl(row, label);
      },
      dependsOn: { field: "value" },
      fromJson: function (parsed) {
        var value = parsed.value;
        if (!isObject(value)) {
          return { reason: "The defaults must be a JSON object." };
        }
        var rows = [];
        var keys = Object.keys(value);
        for (var i = 0; i < keys.length; i += 1) {
          var key = keys[i];
          var found;
          if (has(groups, key)) {
            if (!isObject(value[key])) {
              return { reason: key + " is not a JSON object." };
            }
            var inner = Object.keys(value[key]);
            for (var j = 0; j < inner.length; j += 1) {
              found = rowOf(key + "." + inner[j], value[key], inner[j], parsed);
              if (found.reason) {
                return found;
              }
              rows.push(found.row);
            }
          } else {
            found = rowOf(key, value, key, parsed);
            if (found.reason) {
              return found;
            }
            rows.push(found.row);
          }
        }
        return { rows: rows };
      },
      isBlank: function (row) {
        return row.field === "" && row.value.trim() === "";
      },
      toJson: function (rows) {
        var entries = [];
        var nested = {};
        var problems = [];
        rows.forEach(function (row) {
          var name = row.data.field;
          var field = byName[name];
          if (!field) {
            problems.push({ control: row.controls.field, message: "Choose the field of default " + row.number + "." });
            return;
          }
          var text = row.data.value.trim();
          var json;
          if (field.type === "integer") {
            if (!INTEGER.test(text)) {
              problems.push({ control: row.controls.value, message: name + ": enter a whole number." });
              return;
            }
            json = text;
          } else if (field.type === "object") {
            try {
              if (!isObject(JSON.parse(text))) {
                throw new Error("not an object");
              }
              json = text;
            } catch (error) {
              problems.push({ control: row.controls.value, message: name + ": enter a JSON object, e.g. {}." });
              return;
            }
          } else if (field.choices && row.data.value === "") {
            problems.push({ control: row.controls.value, message: name + ": choose a value." });
            return;
          } else {
            json = JSON.stringify(row.data.value);
          }
          var parts = name.split(".");
          if (parts.length === 1) {
            entries.push([name, json]);
            return;
          }
          if (!has(nested, parts[0])) {
            nested[parts[0]] = [];
            entries.push([parts[0], nested[parts[0]]]);
          }
          nested[parts[0]].push([parts[1], json]);
        });
        var text = objectText(
          entries.map(function (entry) {
            return Array.isArray(entry[1]) ? [entry[0], objectText(entry[1], 1)] : entry;
          }),
          0
        );
        return {
          text: text,
          problems: problems,
          hints: repeatedHints(rows, "field", "the server accepts each field once."),
        };
      },
    };
  }

  // The defaults the template's defaults editor holds now, by dotted name (null when its
  // JSON does not parse), for the hints of the locks and ranges.
  function currentDefaults(form) {
    var values = form && form.querySelector("textarea[data-editor=template-values]");
    if (!values) {
      return null;
    }
    var groups = dataList(values, "data-fields")
      .filter(function (field) {
        return field.name.indexOf(".") !== -1;
      })
      .map(function (field) {
        return field.name.split(".")[0];
      });
    try {
      var parsed = parseJson(values.value.trim() || "{}");
      var flat = {};
      Object.keys(parsed.value || {}).forEach(function (key) {
        var item = parsed.value[key];
        if (isObject(item) && groups.indexOf(key) !== -1) {
          Object.keys(item).forEach(function (inner) {
            flat[key + "." + inner] = item[inner];
          });
        } else {
          flat[key] = item;
        }
      });
      return flat;
    } catch (error) {
      return null;
    }
  }

  function rangesKind(fieldNames, form) {
    var fieldChoices = [["", "Choose a field"]].concat(
      fieldNames.map(function (name) {
        return [name, name];
      })
    );
    return {
      noun: "range",
      add: "Add range",
      empty: "No ranges.",
      columns: [
        { name: "field", label: "Field" },
        { name: "min", label: "Min" },
        { name: "max", label: "Max" },
      ],
      blank: function () {
        return { field: "", min: "", max: "" };
      },
      control: function (column, row, label) {
        if (column === "field") {
          return select({ "aria-label": label }, fieldChoices, row.field);
        }
        return textInput({ "aria-label": label, inputmode: "numeric" }, row[column]);
      },
      dependsOn: {},
      fromJson: function (parsed) {
        var value = parsed.value;
        if (!isObject(value)) {
          return { reason: "The ranges must be a JSON object of field names to {min, max}." };
        }
        var rows = [];
        var keys = Object.keys(value);
        for (var i = 0; i < keys.length; i += 1) {
          var name = keys[i];
          var bounds = value[name];
          if (fieldNames.indexOf(name) === -1) {
            return { reason: name + " is not a numeric field a template bounds." };
          }
          if (!isObject(bounds) || Object.keys(bounds).sort().join() !== "max,min") {
            return { reason: name + ' is not {"min": <integer>, "max": <integer>}.' };
          }
          var min = typeof bounds.min === "number" ? parsed.numberText(bounds, "min") : "";
          var max = typeof bounds.max === "number" ? parsed.numberText(bounds, "max") : "";
          if (!INTEGER.test(min) || !INTEGER.test(max)) {
            return { reason: name + ": min and max are whole numbers." };
          }
          rows.push({ field: name, min: min, max: max });
        }
        return { rows: rows };
      },
      isBlank: function (row) {
        return row.field === "" && row.min.trim() === "" && row.max.trim() === "";
      },
      toJson: function (rows) {
        var entries = [];
        var problems = [];
        var hints = [];
        var defaults = currentDefaults(form);
        rows.forEach(function (row) {
          var name = row.data.field;
          if (name === "") {
            problems.push({ control: row.controls.field, message: "Choose the field of range " + row.number + "." });
            return;
          }
          var min = row.data.min.trim();
          var max = row.data.max.trim();
          var bad = !INTEGER.test(min) ? "min" : !INTEGER.test(max) ? "max" : null;
          if (bad) {
            problems.push({ control: row.controls[bad], message: name + ": the " + bad + " is a whole number." });
            return;
          }
          entries.push([name, '{"min": ' + min + ', "max": ' + max + "}"]);
          if (Number(min) > Number(max)) {
            hints.push({ control: row.controls.min, message: name + ": min must not be greater than max." });
          } else if (defaults && !has(defaults, name)) {
            hints.push({ control: row.controls.field, message: name + ": give a default value inside the range." });
          } else if (defaults && !(Number(min) <= defaults[name] && defaults[name] <= Number(max))) {
            hints.push({ control: row.controls.field, message: name + ": the default " + defaults[name] + " is outside the range." });
          }
        });
        return {
          text: objectText(entries, 0),
          problems: problems,
          hints: hints.concat(repeatedHints(rows, "field", "the server keeps one range a field.")),
        };
      },
    };
  }

  // --- the rows editor -----------------------------------------------------------------------

  function fieldLabel(textarea) {
    var wrapper = textarea.closest(".field");
    var label = wrapper && wrapper.querySelector("label[for='" + textarea.id + "']");
    if (label && !label.id) {
      label.id = textarea.id + "_label";
    }
    return label;
  }

  // The textarea moves into an "Advanced: JSON" disclosure, with a line for what its JSON
  // means to the rows; returns that line.
  function advancedView(textarea, after) {
    var status = element("p", { class: "kv-status help", role: "status" });
    var details = element("details", { class: "kv-advanced" }, [
      element("summary", { text: "Advanced: JSON" }),
    ]);
    after.after(details);
    details.appendChild(textarea);
    details.appendChild(status);
    // A field the server marked invalid shows its JSON: the error may be about it.
    if (textarea.closest(".field-invalid")) {
      details.open = true;
    }
    return status;
  }

  function rowsEditor(textarea, kind) {
    var label = fieldLabel(textarea);
    var locked = textarea.disabled;
    var hintsId = nextId("hints");
    var headRow = element(
      "tr",
      {},
      kind.columns.map(function (column) {
        return element("th", { scope: "col", text: column.label });
      })
    );
    if (!locked) {
      headRow.appendChild(
        element("th", { scope: "col" }, [element("span", { class: "visually-hidden", text: "Remove" })])
      );
    }
    var body = element("tbody");
    var table = element("table", { class: "kv-table" }, [element("thead", {}, [headRow]), body]);
    var empty = element("p", { class: "kv-empty muted", text: kind.empty });
    var add = locked ? null : element("button", { type: "button", class: "button kv-add", text: kind.add });
    var hints = element("ul", { class: "kv-hints", id: hintsId });
    var jsonOnly = element("p", { class: "kv-json-only notice-warning", hidden: true });
    var rowsArea = element("div", { class: "kv-rows" }, [table, empty, add]);
    var editor = element(
      "div",
      {
        class: "kv-editor",
        role: "group",
        "aria-labelledby": label ? label.id : null,
        "data-kv-editor": textarea.getAttribute("data-editor"),
      },
      [rowsArea, jsonOnly, hints]
    );
    (label || textarea).after(editor);
    var status = advancedView(textarea, editor);
    var problems = [];

    function controlLabel(column, number) {
      return capitalized(kind.noun) + " " + number + " " + column.label.toLowerCase();
    }

    function cellOf(column, data, number) {
      var control = kind.control(column.name, data, controlLabel(column, number));
      control.setAttribute("data-column", column.name);
      control.disabled = locked;
      return element("td", {}, [control]);
    }

    function rowElement(data) {
      var number = body.rows.length + 1;
      var row = element(
        "tr",
        {},
        kind.columns.map(function (column) {
          return cellOf(column, data, number);
        })
      );
      if (!locked) {
        row.appendChild(
          element("td", {}, [
            element("button", {
              type: "button",
              class: "button button-quiet kv-remove",
              "aria-label": "Remove " + kind.noun + " " + number,
              text: "Remove",
            }),
          ])
        );
      }
      return row;
    }

    function readRow(row, index) {
      var data = {};
      var controls = {};
      row.querySelectorAll("[data-column]").forEach(function (control) {
        data[control.getAttribute("data-column")] = control.value;
        controls[control.getAttribute("data-column")] = control;
      });
      return { data: data, controls: controls, number: index + 1, element: row };
    }

    function rows() {
      return Array.prototype.map.call(body.rows, readRow);
    }

    // Row numbers are in the controls' names: renumber after a removal.
    function renumber() {
      rows().forEach(function (row) {
        kind.columns.forEach(function (column) {
          row.controls[column.name].setAttribute("aria-label", controlLabel(column, row.number));
        });
        var remove = row.element.querySelector(".kv-remove");
        if (remove) {
          remove.setAttribute("aria-label", "Remove " + kind.noun + " " + row.number);
        }
      });
      empty.hidden = body.rows.length > 0;
      table.hidden = body.rows.length === 0;
    }

    function showHints(found) {
      editor.querySelectorAll("[aria-invalid]").forEach(function (control) {
        control.removeAttribute("aria-invalid");
        control.removeAttribute("aria-describedby");
      });
      hints.replaceChildren();
      found.problems.concat(found.hints).forEach(function (hint, index) {
        var id = hintsId + "-" + index;
        var blocking = index < found.problems.length;
        hints.appendChild(
          element("li", { id: id, class: blocking ? "kv-hint kv-hint-error" : "kv-hint", text: hint.message })
        );
        if (blocking) {
          hint.control.setAttribute("aria-invalid", "true");
        }
        var describedBy = hint.control.getAttribute("aria-describedby");
        hint.control.setAttribute("aria-describedby", describedBy ? describedBy + " " + id : id);
      });
    }

    // The rows, written into the textarea unless a row cannot be written yet.
    function write() {
      var found = check();
      if (problems.length) {
        status.textContent = "The JSON is written again once the marked rows are fixed.";
      } else {
        textarea.value = found.text;
        status.textContent = "";
      }
      editor.dispatchEvent(new CustomEvent("kv:change", { bubbles: true }));
    }

    function showRows(data) {
      body.replaceChildren();
      data.forEach(function (item) {
        body.appendChild(rowElement(item));
      });
      renumber();
    }

    function check() {
      var found = kind.toJson(
        rows().filter(function (row) {
          return !kind.isBlank(row.data);
        })
      );
      problems = found.problems;
      showHints(found);
      return found;
    }

    // The textarea's JSON as rows, or why it stays JSON only.
    function read() {
      var shown;
      try {
        shown = kind.fromJson(parseJson(textarea.value.trim() || "{}"));
        status.textContent = "";
      } catch (error) {
        shown = { reason: "the JSON does not parse." };
        status.textContent = "The JSON does not parse: " + error.message;
      }
      jsonOnly.hidden = !shown.reason;
      rowsArea.hidden = !!shown.reason;
      if (shown.reason) {
        jsonOnly.textContent = "Shown as JSON only: " + shown.reason + " Edit it under Advanced: JSON.";
        problems = [];
        hints.replaceChildren();
        textarea.closest("details").open = true;
        return;
      }
      showRows(shown.rows);
      check();
    }

    if (!locked) {
      editor.addEventListener("input", write);
      editor.addEventListener("change", function (event) {
        var column = event.target.getAttribute && event.target.getAttribute("data-column");
        var dependent = column && kind.dependsOn[column];
        if (dependent) {
          var row = event.target.closest("tr");
          var data = readRow(row, row.sectionRowIndex).data;
          var old = row.querySelector("[data-column=" + dependent + "]");
          var index = kind.columns.findIndex(function (candidate) {
            return candidate.name === dependent;
          });
          old.closest("td").replaceWith(cellOf(kind.columns[index], data, row.sectionRowIndex + 1));
        }
        write();
      });
      add.addEventListener("click", function () {
        var row = rowElement(kind.blank());
        body.appendChild(row);
        renumber();
        row.querySelector("[data-column]").focus();
      });
      body.addEventListener("click", function (event) {
        var remove = event.target.closest(".kv-remove");
        if (!remove) {
          return;
        }
        var row = remove.closest("tr");
        var next = row.nextElementSibling || row.previousElementSibling;
        row.remove();
        renumber();
        write();
        (next ? next.querySelector("[data-column]") : add).focus();
      });
      textarea.addEventListener("input", read);
    }
    read();

    return {
      problems: function () {
        return rowsArea.hidden ? [] : problems;
      },
      refresh: function () {
        if (!rowsArea.hidden && !locked) {
          check();
        }
      },
    };
  }

  // --- the locks: a checkbox per field -------------------------------------------------------

  function locksEditor(textarea, fieldNames) {
    var label = fieldLabel(textarea);
    var hints = element("ul", { class: "kv-hints" });
    var boxes = fieldNames.map(function (name) {
      var id = nextId("lock");
      var box = element("input", { type: "checkbox", id: id, value: name });
      return { name: name, box: box, item: element("li", {}, [box, element("label", { for: id, text: name })]) };
    });
    var editor = element(
      "div",
      {
        class: "kv-editor kv-locks",
        role: "group",
        "aria-labelledby": label ? label.id : null,
        "data-kv-editor": "template-locks",
      },
      [
        element(
          "ul",
          { class: "kv-checks" },
          boxes.map(function (entry) {
            return entry.item;
          })
        ),
        hints,
      ]
    );
    (label || textarea).after(editor);
    var status = advancedView(textarea, editor);
    var unknown = [];

    function names() {
      return textarea.value.replace(/,/g, " ").split(/\s+/).filter(Boolean);
    }

    function showHints() {
      var defaults = currentDefaults(textarea.form);
      hints.replaceChildren();
      boxes.forEach(function (entry) {
        entry.box.removeAttribute("aria-describedby");
        if (entry.box.checked && defaults && !has(defaults, entry.name)) {
          var id = nextId("lock-hint");
          hints.appendChild(
            element("li", { id: id, class: "kv-hint", text: entry.name + ": give the value it is locked to." })
          );
          entry.box.setAttribute("aria-describedby", id);
        }
      });
    }

    function read() {
      var given = names();
      boxes.forEach(function (entry) {
        entry.box.checked = given.indexOf(entry.name) !== -1;
      });
      unknown = given.filter(function (name) {
        return fieldNames.indexOf(name) === -1;
      });
      status.textContent = unknown.length
        ? "Not fields a template locks (kept, for the server to check): " + unknown.join(", ") + "."
        : "";
      if (unknown.length) {
        textarea.closest("details").open = true;
      }
      showHints();
    }

    editor.addEventListener("change", function () {
      var checked = boxes
        .filter(function (entry) {
          return entry.box.checked;
        })
        .map(function (entry) {
          return entry.name;
        });
      textarea.value = checked.concat(unknown).join("\n");
      showHints();
    });
    textarea.addEventListener("input", read);
    read();
    return {
      problems: function () {
        return [];
      },
      refresh: showHints,
    };
  }

  // --- wiring --------------------------------------------------------------------------------

  function dataList(textarea, name) {
    try {
      return JSON.parse(textarea.getAttribute(name) || "[]");
    } catch (error) {
      return [];
    }
  }

  function editorFor(textarea) {
    var kind = textarea.getAttribute("data-editor");
    if (kind === "params") {
      return rowsEditor(textarea, paramsKind);
    }
    if (kind === "env") {
      var pattern = textarea.getAttribute("data-key-pattern");
      return rowsEditor(textarea, envKind(pattern ? new RegExp(pattern) : null));
    }
    if (kind === "template-values") {
      return rowsEditor(textarea, templateValuesKind(dataList(textarea, "data-fields")));
    }
    if (kind === "template-ranges") {
      return rowsEditor(textarea, rangesKind(dataList(textarea, "data-fields"), textarea.form));
    }
    if (kind === "template-locks") {
      return locksEditor(textarea, dataList(textarea, "data-fields"));
    }
    return null;
  }

  function enhance(form) {
    var editors = Array.prototype.map
      .call(form.querySelectorAll("textarea[data-editor]"), editorFor)
      .filter(Boolean);
    if (!editors.length) {
      return;
    }
    // The locks' and ranges' hints read the defaults: refresh them when any editor changes.
    form.addEventListener("kv:change", function () {
      editors.forEach(function (editor) {
        editor.refresh();
      });
    });
    form.addEventListener("input", function (event) {
      if (event.target.matches && event.target.matches("textarea[data-editor=template-values]")) {
        editors.forEach(function (editor) {
          editor.refresh();
        });
      }
    });
    // A row that cannot be written as JSON yet (a number that is none, no name) keeps the form
    // from being sent, so what is sent is what the rows show. Stopped here, before gantry.js
    // marks the form as being sent.
    form.addEventListener("submit", function (event) {
      var first = null;
      editors.forEach(function (editor) {
        first = first || editor.problems()[0] || null;
      });
      if (first) {
        event.preventDefault();
        event.stopPropagation();
        first.control.focus();
      }
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("form").forEach(function (form) {
      if (form.querySelector("textarea[data-editor]")) {
        enhance(form);
      }
    });
  });
})();
