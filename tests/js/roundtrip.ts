// The report golden vectors through Modelina's models of the conformance example's document.
//
// Compiled with tsc (strict) beside the generated models (./models/), then run as
// node roundtrip.js PATHS.json: PATHS.json is a list of report vectors' .bin files. Prints
// {"unmarshalled": {path: marshal() of unmarshal(body)}, "constructed": marshal() of a
// started report built with the constructor}, for tests/js/test_asyncapi_in_modelina.py.

import { FailureReport } from "./models/FailureReport";
import { ProgressReport } from "./models/ProgressReport";
import { ProtocolVersion } from "./models/ProtocolVersion";
import { StartedReport } from "./models/StartedReport";
import { SuccessReport } from "./models/SuccessReport";

// No @types/node: the two things used from node, typed here.
declare const process: { argv: string[]; stdout: { write(text: string): void } };
declare function require(name: "fs"): {
  readFileSync(path: string, encoding: "utf8"): string;
};
const { readFileSync } = require("fs");

const models = {
  started: StartedReport,
  progress: ProgressReport,
  success: SuccessReport,
  failure: FailureReport,
};

const unmarshalled: Record<string, string> = {};
const paths: string[] = JSON.parse(readFileSync(process.argv[2], "utf8"));
for (const path of paths) {
  const body: { type: keyof typeof models } = JSON.parse(readFileSync(path, "utf8"));
  unmarshalled[path] = models[body.type].unmarshal(body).marshal();
}

// The constructor asks for protocol_version (the enum); service and type are constants.
const constructed = new StartedReport({
  attempt: 1,
  clientId: "client-a",
  protocolVersion: ProtocolVersion.NUMBER_1,
  taskId: "t-0001",
  timestamp: "2026-11-29T22:48:46.123456Z",
}).marshal();

process.stdout.write(JSON.stringify({ unmarshalled, constructed }));
