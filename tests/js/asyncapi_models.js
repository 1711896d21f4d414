// AsyncAPI documents through @asyncapi/parser, then Modelina's TypeScript models of each.
//
// Reads from stdin [{"document": path, "out": folder, "from_object": bool}]; prints one result
// per document, in order: {"diagnostics": [{"code", "severity", "message", "path"}],
// "models": [name, ...], "warnings": [...]}, plus "models_from_object" and "object_warnings"
// when from_object is true. They are the parser's diagnostics (severity 0 error, 1 warning,
// 2 information, 3 hint), the name of every model Modelina generated from the file (one .ts
// file each in the folder: classes with marshal/unmarshal, as TS_COMMON_PRESET writes them),
// Modelina's warnings (such as a model overwritten by another of the same name), and the
// models it makes of the same document given as an object instead of a file.
//
// Modelina 5.10 is given the file, as a file:// URL: given the document itself (an object or
// a string), it checks its version against a list that ends at 3.0.0, and of a 3.1.0 document
// makes a single model of type any, with only a warning.
// Run by tests/js/test_asyncapi_in_modelina.py, with NODE_PATH at the pinned tools.
"use strict";

const fs = require("fs");
const { pathToFileURL } = require("url");
const { Parser } = require("@asyncapi/parser");
const {
  Logger,
  TS_COMMON_PRESET,
  TypeScriptFileGenerator,
  TypeScriptGenerator,
} = require("@asyncapi/modelina");

async function generate(parser, { document, out, from_object: fromObject }) {
  const text = fs.readFileSync(document, "utf8");
  const { diagnostics } = await parser.parse(text);
  const warnings = [];
  Logger.setLogger({
    debug: () => {},
    info: () => {},
    warn: (...args) => warnings.push(args.join(" ")),
    error: (...args) => warnings.push(args.join(" ")),
  });
  const options = {
    modelType: "class",
    presets: [{ preset: TS_COMMON_PRESET, options: { marshalling: true } }],
  };
  const said = {};
  if (fromObject) {
    const models = await new TypeScriptGenerator(options).generate(JSON.parse(text));
    said.models_from_object = models.map((model) => model.modelName);
    said.object_warnings = warnings.splice(0);
  }
  const models = await new TypeScriptFileGenerator(options).generateToFiles(
    pathToFileURL(document).href,
    out,
    { exportType: "named" },
    true,
  );
  return {
    ...said,
    diagnostics: diagnostics.map((d) => ({
      code: String(d.code),
      severity: d.severity,
      message: d.message,
      path: d.path,
    })),
    models: models.map((model) => model.modelName),
    warnings,
  };
}

async function main() {
  const parser = new Parser();
  const results = [];
  for (const request of JSON.parse(fs.readFileSync(0, "utf8"))) {
    results.push(await generate(parser, request));
  }
  process.stdout.write(JSON.stringify(results));
}

main().catch((error) => {
  process.stderr.write(`${error.stack || error}\n`);
  process.exit(1);
});
