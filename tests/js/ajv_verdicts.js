// ajv 8 (draft 2020-12) on the protocol's schemas and the golden vectors' bodies.
//
// Reads from stdin {"schemas": {name: schema}, "bodies": [{"id", "schema", "path"}],
// "date_times": [string]}; prints {"compile": {mode: {name: error or null}}, "logs": [...],
// "verdicts": {id: {"plain": bool, "formats": bool}}, "date_times": {string: bool}}.
// Modes: "default" (ajv's default strict mode, with ajv-formats), "strict" (every strict
// option an error, with ajv-formats), "plain" (formats not validated: no ajv-formats).
// Run by tests/js/test_schemas_in_ajv.py, with NODE_PATH at the pinned tools.
"use strict";

const fs = require("fs");
const Ajv2020 = require("ajv/dist/2020").default;
const addFormats = require("ajv-formats").default;

const input = JSON.parse(fs.readFileSync(0, "utf8"));
const logs = [];
// ajv's strict mode "log" settings (strictTypes by default) write here instead of failing.
const logger = {
  log: (...args) => logs.push(["log", ...args].join(" ")),
  warn: (...args) => logs.push(["warn", ...args].join(" ")),
  error: (...args) => logs.push(["error", ...args].join(" ")),
};
const modes = {
  default: addFormats(new Ajv2020({ logger })),
  strict: addFormats(new Ajv2020({ logger, strict: true })),
  plain: new Ajv2020({ logger, validateFormats: false }),
};

const compile = {};
const validators = {};
for (const [mode, ajv] of Object.entries(modes)) {
  compile[mode] = {};
  validators[mode] = {};
  for (const [name, schema] of Object.entries(input.schemas)) {
    try {
      validators[mode][name] = ajv.compile(schema);
      compile[mode][name] = null;
    } catch (error) {
      compile[mode][name] = String(error.message);
    }
  }
}

const verdicts = {};
for (const { id, schema, path } of input.bodies) {
  const document = JSON.parse(fs.readFileSync(path, "utf8"));
  const check = (mode) => (validators[mode][schema] ? validators[mode][schema](document) : null);
  verdicts[id] = { plain: check("plain"), formats: check("default") };
}

const dateTime = modes.default.compile({ type: "string", format: "date-time" });
const dateTimes = {};
for (const text of input.date_times) dateTimes[text] = dateTime(text);

process.stdout.write(JSON.stringify({ compile, logs, verdicts, date_times: dateTimes }));
