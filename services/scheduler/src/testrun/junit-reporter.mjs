// The JUnit reporter of sandmesh test runs (services/scheduler/src/testrun/junit-reporter.mjs),
// for `node --test`: Node 18 (the sandbox's) has no built-in `junit` reporter. It rewrites the
// whole report at $SANDMESH_TEST_REPORT after every finished test, so a run cut off by its
// deadline still leaves a report of the tests that finished.
import { writeFileSync } from "node:fs";
import { basename, extname } from "node:path";

const escape = (text) =>
  String(text)
    // Characters XML 1.0 cannot carry at all.
    .replace(/[^\x09\x0A\x0D\x20-\uD7FF\uE000-\uFFFD\u{10000}-\u{10FFFF}]/gu, "\uFFFD")
    .replace(/&/g, "&amp;")
    .replace(/</g, "&lt;")
    .replace(/>/g, "&gt;")
    .replace(/"/g, "&quot;")
    // Attribute values keep their line breaks and tabs only as references.
    .replace(/\n/g, "&#10;")
    .replace(/\r/g, "&#13;")
    .replace(/\t/g, "&#9;");

function message(error) {
  if (!error) return "";
  const cause = error.cause ?? error;
  return cause?.message ?? String(cause);
}

// A test's verdict: its own code failed, or something around it (a hook, a timeout, a
// cancellation) broke.
function verdict(data) {
  if (data.skip !== undefined && data.skip !== false) return ["skipped", data.skip];
  if (data.todo !== undefined && data.todo !== false) return ["skipped", data.todo];
  const error = data.details?.error;
  if (!error) return null;
  const kind = error.failureType === "testCodeFailure" ? "failure" : "error";
  return [kind, message(error)];
}

export default async function* junit(source) {
  const cases = [];
  // Per nesting level: the names of the tests running, and whether the one at that level had
  // subtests (then it is a suite or a file, not a test case of its own).
  const names = [];
  const hadChildren = [];
  const write = () => {
    const body = cases.join("");
    writeFileSync(
      process.env.SANDMESH_TEST_REPORT,
      `<?xml version="1.0" encoding="utf-8"?>\n<testsuites><testsuite name="node --test" tests="${cases.length}">${body}</testsuite></testsuites>\n`,
    );
  };
  for await (const event of source) {
    const data = event.data ?? {};
    const nesting = data.nesting ?? 0;
    if (event.type === "test:start") {
      names[nesting] = data.name;
      hadChildren[nesting] = false;
      if (nesting > 0) hadChildren[nesting - 1] = true;
      continue;
    }
    if (event.type !== "test:pass" && event.type !== "test:fail") continue;
    if (nesting > 0) hadChildren[nesting - 1] = true;
    const parent = hadChildren[nesting];
    hadChildren[nesting] = false;
    const failureType = data.details?.error?.failureType;
    // A suite or file is reported through its tests, unless it broke on its own.
    if (parent && (event.type === "test:pass" || failureType === "subtestsFailed")) continue;
    if (data.details?.type === "suite" && event.type === "test:pass") continue;
    const file = data.file ? basename(data.file, extname(data.file)) : "";
    const classname = names.slice(0, nesting).filter(Boolean).join(" > ") || file;
    const seconds = (data.details?.duration_ms ?? 0) / 1000;
    const outcome = verdict(data);
    const inner = outcome
      ? `<${outcome[0]} message="${escape(outcome[1] ?? "")}"/>`
      : "";
    cases.push(
      `<testcase name="${escape(data.name)}" classname="${escape(classname)}" time="${seconds}">${inner}</testcase>`,
    );
    write();
  }
  write();
}
